"""``grader submit --server URL (--token T | --token-file F) [--wait] PATH``: hand in to a ``grader serve``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grader.handin import client


def add_connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=os.environ.get("GRADER_SERVER"), metavar="URL",
                        help="the course's grading server (default: $GRADER_SERVER)")
    parser.add_argument("--token", default=None, help="your token (prefer --token-file: a command line is visible "
                        "to other users of the machine)")
    parser.add_argument("--token-file", default=None, metavar="FILE", help="a file holding your token")


def connect(args: argparse.Namespace) -> client.Server:
    if not args.server:
        raise client.ClientError("give the server: --server URL (or $GRADER_SERVER)")
    return client.Server(args.server, client.token_from(token=args.token, token_file=args.token_file))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="your assignments/ folder, a .zip of it, or a .ipynb notebook")
    add_connection(parser)
    parser.add_argument("--wait", action="store_true", help="wait for the grade and print the report")
    parser.add_argument("--wait-timeout", type=float, default=None, metavar="S", help="stop waiting after S seconds")


def run(args: argparse.Namespace) -> int:
    try:
        server = connect(args)
        sub = client.submit(server, Path(args.path))
        for problem in sub.get("problems", []):
            print(f"note: {problem}", file=sys.stderr)
        print(f"submitted: {client.status_line(sub)}; exercises {', '.join(sub['exercises'])}")
        if not args.wait:
            # the same token option (the token itself is not echoed); none where it came from $GRADER_TOKEN
            token = (f" --token-file {args.token_file}" if args.token_file
                     else " --token YOUR_TOKEN" if args.token else "")
            print(f"see it with: grader results --server {args.server}{token} {sub['id']}")
            return 0
        sub = client.wait(server, sub["id"], timeout_s=args.wait_timeout)
        if sub["status"] != "done":
            return 1
        print(client.report(server, sub["id"]))
        return 0
    except client.ClientError as exc:
        print(f"grader submit: {exc}", file=sys.stderr)
        return 2
