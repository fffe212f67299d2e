"""The reasoning-gym scorer process (started by spotrl/rewards/rgym.py; not imported by spotrl).

Protocol, one JSON object per line: after importing reasoning-gym it writes {"ready": true}; then
for each request {"dataset", "options", "entry", "answer"} read from stdin it writes {"score": x}, or
{"error": "..."} when the dataset's score_answer raised. It exits when stdin closes (its parent is
gone). Run as a file with `python -I`: nothing of the trainer's environment or working tree is
importable, and the scorer's own prints go to stderr, never into the protocol.
"""

import json
import os
import resource
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]  # spotrl/rewards is not a package root
    protocol, sys.stdout = sys.stdout, sys.stderr
    memory_bytes = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    import reasoning_gym

    if memory_bytes:  # after the imports: a runaway answer (a huge power) ends in MemoryError
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    datasets = {}
    protocol.write('{"ready": true}\n')
    protocol.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            key = (request["dataset"], json.dumps(request["options"], sort_keys=True))
            if key not in datasets:
                datasets[key] = reasoning_gym.create_dataset(request["dataset"], size=1, seed=0, **request["options"])
            reply = {"score": float(datasets[key].score_answer(request["answer"], request["entry"]))}
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it there
            reply = {"error": f"{type(err).__name__}: {err}"[:2000]}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
