# The course's environment where scripts/bootstrap.sh cannot build it (macOS, Windows: Triton publishes wheels for
# Linux x86-64 and aarch64 only): Linux, the CPU build of PyTorch, and this project with the versions of
# .ci/constraints.txt. Builds for linux/amd64 and linux/arm64 (Apple silicon). Kernels run in the Triton interpreter
# here, as on any machine without an NVIDIA GPU. How to use it: docs/student-environment.md.
FROM python:3.11-slim

# PyTorch first and explicitly, as scripts/bootstrap.sh does (the same version): its CPU build is ~200 MB where the
# default one pulls several GB of CUDA packages. The index is an argument for a mirror or a local copy.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# The project (editable) with the exact versions CI was verified with, triton the grading GPUs'. Only what the install
# reads is copied first, so that editing an exercise does not reinstall the dependencies.
WORKDIR /course
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/
COPY grader/ grader/
RUN pip install --no-cache-dir -c .ci/constraints.txt -e .
COPY . .

CMD ["bash"]
