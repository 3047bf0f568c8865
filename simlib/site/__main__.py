"""``python -m simlib.site build|reference|serve``: see :mod:`simlib.site`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simlib.site", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the site into build/site/ (nothing executed, nothing downloaded)")
    b.add_argument("--out", default=None, help="output folder (default: build/site)")
    r = sub.add_parser("reference", help="execute the notebooks in quick mode into docs/reference/")
    r.add_argument("names", nargs="*", help="notebooks to run (default: every one in notebooks/)")
    s = sub.add_parser("serve", help="build, then serve the site on 127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    if args.command == "reference":
        from .reference import main as reference

        record = reference(args.names)
        bad = [k for k, v in record["notebooks"].items() if v["status"] != "ok"]
        return 1 if bad else 0
    from .build import build, serve

    if args.command == "build":
        build(out=args.out)
        return 0
    serve(port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
