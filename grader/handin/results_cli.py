"""``grader results --server URL (--token T | --token-file F) [ID]``: your submissions to a ``grader serve``, or
one of them with its report."""

from __future__ import annotations

import argparse
import sys

from grader.handin import client
from grader.handin.submit_cli import add_connection, connect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", type=int, default=None, metavar="ID", help="one submission: its report")
    add_connection(parser)


def run(args: argparse.Namespace) -> int:
    try:
        server = connect(args)
        if args.id is None:
            listing = server.json("GET", "/api/submissions")
            if not listing["speed_graded"]:
                print(f"graded on {listing['device']}: speed is graded on a GPU only")
            for sub in listing["submissions"]:
                print(client.status_line(sub))
            if not listing["submissions"]:
                print("no submissions yet")
            return 0
        sub = server.json("GET", f"/api/submissions/{args.id}")
        print(client.status_line(sub))
        if sub["status"] == "done":
            print(client.report(server, args.id))
        return 0
    except client.ClientError as exc:
        print(f"grader results: {exc}", file=sys.stderr)
        return 2
