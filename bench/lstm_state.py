"""How a recurrent agent's LSTM state grows over whole games, from a checkpoint: plays games as
--mode=test does (the env the actors step, the sampled actions) and reports, at some steps of each
game, the size of the LSTM's cell state. A cell that only grows (a unit that adds about the same
each step and forgets nothing) sits where tanh is flat: its output is a constant sign and no
gradient flows back through it. It answers "does my recurrent net use its memory, or count time?".

    .venv/bin/python bench/lstm_state.py bench/results/2core-amd-epyc/pong_runs/resnet_lstm_lr25_seed1 --games 4
    .venv/bin/python bench/lstm_state.py results/memory_run --games 20 --steps 1 5 11 --out state.json

Per game: its return, its length and, on Atari, its points in order (+ won, - lost); at each of
--steps: the median and the largest |cell| over the units, how many units have |cell| > 3 (tanh
within 0.5 % of +-1) and how many > 100.
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: the project's packages and experiment.py's flags
    sys.path.insert(0, ROOT)

SATURATED, COUNTING = 3.0, 100.0


def cell_figures(cell):
    """|cell| of one env's state [units]: median, max, units saturated (> 3) and counting (> 100)."""
    a = np.abs(np.asarray(cell, np.float64))
    return {"median": float(np.median(a)), "max": float(a.max()), "saturated": int((a > SATURATED).sum()),
            "over_100": int((a > COUNTING).sum()), "units": int(a.size)}


def play(policy, initial_state, env, games, steps):
    """Plays `games` whole games; each game's return, length, points and cell_figures at `steps`."""
    import tensorflow as tf
    out, state, first, t, points, marks = [], initial_state, True, 0, [], {}
    while len(out) < games:
        action, state = policy(tf.constant(env.obs), tf.constant([first]), state)
        t += 1
        if t in steps:
            marks[t] = cell_figures(state.cell.numpy()[0])
        result = env.step(action.numpy()[0])
        first = bool(result.new_episode[0])
        if result.reward[0] != 0 and env.is_atari:
            points.append("+" if result.reward[0] > 0 else "-")
        if result.episode_end[0]:
            out.append({"return": float(result.episode_return[0]), "length": int(result.episode_length[0]),
                        "points": "".join(points), "steps": marks})
            t, points, marks = 0, [], {}
    return out


def restored(run):
    """(agent, EvalEnv) of a run folder or checkpoint, with the flags its options.json saved."""
    import experiment
    from impala import agent as agent_lib
    from impala import evaluator
    from impala import learner as learner_lib
    experiment.FLAGS(["lstm_state.py", "--mode=test", "--load_model_url=" + run])
    saved, folder = experiment.load_saved_options(run)
    experiment.apply_saved_options(saved, os.path.join(folder, "options.json"))
    flags = experiment.FLAGS
    agent, _, _ = learner_lib.restored_agent(flags, run)
    if not hasattr(agent.initial_state(1), "cell"):
        raise SystemExit("lstm_state.py: %s's agent %s has no LSTM state; give the run of a recurrent agent "
                         "(ResNetLSTMAgent, MLPLSTMAgent, ...)" % (run, flags.agent_name))
    env = evaluator.EvalEnv(flags.level_name, flags.env_backend, flags.seed + evaluator.TEST_SEED_OFFSET,
                            agent_lib.frame_size_of(flags))
    return agent, env


def table(games):
    lines = ["| game | return | length | step | median abs(cell) | max abs(cell) | units > 3 | units > 100 |",
             "|---|---|---|---|---|---|---|---|"]
    for i, g in enumerate(games, 1):
        for step, f in sorted(g["steps"].items()):
            lines.append("| %d | %g | %d | %d | %.1f | %.0f | %d of %d | %d |" % (
                i, g["return"], g["length"], step, f["median"], f["max"], f["saturated"], f["units"], f["over_100"]))
    points = ["- game %d: %s" % (i, g["points"]) for i, g in enumerate(games, 1) if g["points"]]
    return lines + (["", "Points in order (+ won, - lost):"] + points if points else [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run", help="a run folder (its newest readable checkpoint) or a checkpoint prefix")
    p.add_argument("--games", type=int, default=4, help="whole games to play")
    p.add_argument("--steps", type=int, nargs="+", default=[10, 100, 500, 1000, 1500, 2000],
                   help="the steps of each game at which the cell state is measured (1 = after the first)")
    p.add_argument("--out", help="also write the games as JSON here")
    a = p.parse_args(argv)
    if not os.path.exists(a.run) and not os.path.exists(a.run + ".index"):
        raise SystemExit("lstm_state.py: %s does not exist (a run folder or a checkpoint prefix)" % a.run)
    if a.games < 1 or min(a.steps) < 1:
        raise SystemExit("lstm_state.py: --games and --steps take whole numbers from 1")
    from impala import evaluator
    agent, env = restored(a.run)
    try:
        games = play(evaluator.make_policy(agent, "sample"), agent.initial_state(1), env, a.games, set(a.steps))
    finally:
        env.close()
    print("\n".join(table(games)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(games, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
