"""A fresh process that runs a learner's function on plain problems, where the grader's own code cannot be reached.

Started by the grader as ``python -I answer_box.py`` (:func:`run_boxed`); it imports nothing of simlib before the
answer. Before the answer's bytes are unpickled it installs an *audit hook* (PEP 578: once added, no Python code
can remove it; ``sys.setprofile(None)`` or a restored ``sys.modules`` changes nothing): importing
``simlib.grading`` or opening any file under ``simlib/grading/`` is refused and noted. Each call of the answer is
stopped after a time limit by a timer signal. What comes back is JSON: per problem ``["ok", [ints]]``, or the
first ``["used" | "timeout" | "error", why]``, which ends the list. (issue 47: the "no grader calls" watch was a
``sys.setprofile`` in the answer's own process, which ``sys.setprofile(None)`` switched off.)
"""

from __future__ import annotations

import json
import os
import sys

FORBIDDEN_MODULE = "simlib.grading"


def run_boxed(data: bytes, problems: list, limit: float, timeout: float) -> list:
    """In the grader: run the answer pickled in ``data`` on ``problems`` (lists of plain values) in a fresh box
    process; returns its list of ``[kind, value]``. ``timeout``: for the whole box (start-up included)."""
    import base64
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    payload = json.dumps(
        dict(answer=base64.b64encode(data).decode(), problems=problems, limit=limit, forbidden=here + os.sep)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    try:
        done = subprocess.run(
            [sys.executable, "-I", os.path.join(here, "answer_box.py")],
            input=payload.encode(),
            capture_output=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return [["timeout", f"your function did not finish within {timeout:.0f} s"]]
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return [["error", f"the process running your function ended: {tail[0][:300]}"]]


def _main() -> None:  # in the box
    import base64
    import signal

    request = json.loads(sys.stdin.read())
    forbidden, used = request["forbidden"], []

    def hook(event, args):
        if event == "import" and args and str(args[0]).startswith(FORBIDDEN_MODULE):
            why = f"import {args[0]}"
        elif event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            why = f"open {os.path.basename(path)}" if os.path.abspath(path).startswith(forbidden) else ""
        else:
            return
        if why:
            used.append(why)
            raise PermissionError(f"the grader's own code is not yours to call ({why})")

    sys.addaudithook(hook)  # from here on, for the life of this process
    out = []

    class Expired(BaseException):
        pass

    def expire(*_):
        raise Expired

    signal.signal(signal.SIGALRM, expire)
    try:
        import cloudpickle

        answer = cloudpickle.loads(base64.b64decode(request["answer"]))
        for problem in request["problems"]:
            signal.setitimer(signal.ITIMER_REAL, request["limit"])
            try:
                got = answer(*[list(a) if isinstance(a, list) else a for a in problem])
                chosen = sorted({int.__int__(int(i)) for i in got})
            except Expired:
                out.append(["timeout", f"one call of your function ran longer than {request['limit']:g} s"])
                break
            except Exception as exc:  # noqa: BLE001 - the learner's code
                out.append(["used", used[0]] if used else ["error", f"{type(exc).__name__}: {exc}"[:300]])
                break
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if used:
                out.append(["used", used[0]])
                break
            out.append(["ok", chosen])
    except Expired:
        out.append(["timeout", f"your function ran longer than {request['limit']:g} s"])
    except Exception as exc:  # noqa: BLE001 - unpickling the answer
        out.append(["used", used[0]] if used else ["error", f"{type(exc).__name__}: {exc}"[:300]])
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # no interpreter shutdown: nothing of the answer's runs after its verdict


if __name__ == "__main__":
    _main()
