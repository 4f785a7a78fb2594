"""End-to-end Pong frames/s (1 learner + actors, training running) for actor layouts:
how many actor processes, envs each, env threads and groups.

  .venv/bin/python bench/actor_layout.py 40 "2|32" "1|64|--env_threads=1" "1|64|--env_threads=2" \\
      "2|32|--env_groups=1"

Each argument after the seconds is "actors|envs per actor|extra flag|...". Prints one line per
layout with the learner's time breakdown (summary.json), in the order given.
"""
import sys

from bench import cpu_split
from bench import run as harness


def main():
    seconds, layouts = float(sys.argv[1]), [a.split("|") for a in sys.argv[2:]]
    for layout in layouts:
        actors, envs, extra = int(layout[0]), int(layout[1]), layout[2:]
        fps, tb = harness.impala_fps("PongNoFrameskip-v4", "SimpleConvNetAgent", actors, envs, seconds, 19300, extra)
        cpu = cpu_split.report(tb.pop("cpu", {}))
        print("%s: %.0f fps | %s\n    CPU: %s" % (layout, fps, tb, cpu), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
