"""On-policy, single-process probe of the learner's math on Atari (diagnosis tool).

  .venv/bin/python bench/pong_probe.py --frames 400000 --every 75 --opt adam --eps 1e-8 --lr 5e-4

Steps --n envs for --T steps with the current policy, then takes --K gradient steps of
learner.compute_losses (V-trace, no transport, no lag) on that batch; every --every
updates prints frames, the mean return of the last 20 games, the entropy, the gradient
norm and the share of "dead" ReLU channels of the SimpleConvNetAgent (never positive
anywhere on the batch's frames) per layer. bench/results/pong_diagnosis.md was made
with it. --opt: rms (Sonnet's RMSProp, mean square from 0), rms1 (mean square from 1, as
TF1 and learner.make_optimizer), adam. --fake 1: reward 1 for action 2 (can the policy
move at all?); --fake 2: reward 1 for moving the paddle toward the ball, discount 0 (a
visual contextual bandit).
"""
import argparse
import time
import types
import numpy as np, tensorflow as tf, sonnet as snt
import envs
import nets
from impala import learner as L

p = argparse.ArgumentParser()
p.add_argument("--frames", type=int, default=2_000_000)
p.add_argument("--n", type=int, default=16)
p.add_argument("--T", type=int, default=20)
p.add_argument("--lr", type=float, default=6e-4)
p.add_argument("--eps", type=float, default=1e-5)
p.add_argument("--opt", default="rms")  # rms | rms1 (ms init 1) | adam
p.add_argument("--ent", type=float, default=0.01)
p.add_argument("--clip", type=float, default=40.0)
p.add_argument("--level", default="PongNoFrameskip-v4")
p.add_argument("--K", type=int, default=1)
p.add_argument("--ppo", type=float, default=0.0)
p.add_argument("--ortho", type=int, default=0)
p.add_argument("--mean", type=int, default=0)
p.add_argument("--advnorm", type=int, default=0)
p.add_argument("--every", type=int, default=100)
p.add_argument("--bc", type=float, default=0.5)
p.add_argument("--fake", type=int, default=0)
a = p.parse_args()
tf.random.set_seed(0)
spec = envs.env_spec(a.level)
agent = nets.make_agent("SimpleConvNetAgent", spec.num_actions, spec.obs_shape)
E = [envs.make_env(a.level, seed=i) for i in range(a.n)]
obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(E)])
agent(tf.constant(obs), tf.ones([a.n], bool), ())
V = agent.trainable_variables
if a.ortho:
    init = tf.keras.initializers.Orthogonal
    for v in V:
        if len(v.shape) > 1:
            gain = 0.01 if "policy" in v.name else (1.0 if "baseline" in v.name else 2 ** 0.5)
            w = init(gain=gain, seed=1)((int(np.prod(v.shape[:-1])), v.shape[-1]))
            v.assign(tf.reshape(w, v.shape))
if a.opt == "adam":
    opt = snt.optimizers.Adam(a.lr, epsilon=a.eps)
else:
    opt = snt.optimizers.RMSProp(a.lr, decay=0.99, epsilon=a.eps)
opt.apply([tf.zeros_like(v) for v in V], V)
if a.opt == "rms1":
    for v in opt.ms: v.assign(tf.ones_like(v))
flags = types.SimpleNamespace(reward_clipping="abs_one", discounting=(0.0 if a.fake == 2 else 0.99), baseline_cost=a.bc,
                              entropy_cost=a.ent, vtrace_lambda=1.0, clip_param=a.ppo,
                              normalize_advantages=bool(a.advnorm))
step = tf.function(lambda o: agent(o, tf.ones([a.n], bool), ())[0])

@tf.function
def train(batch):
    with tf.GradientTape() as tape:
        out, _ = agent.unroll(batch["observation"], batch["first"], ())
        loss, st = L.compute_losses(out, batch, flags)  # --ppo: the clipped surrogate (APPO)
        if a.mean:
            loss = loss / tf.cast(tf.size(batch["reward"]), tf.float32)
    g = tape.gradient(loss, V)
    gn = tf.linalg.global_norm(g)
    if a.clip > 0:
        g, _ = tf.clip_by_global_norm(g, a.clip, use_norm=gn)
    opt.apply(g, V)
    st["grad_norm"] = gn
    return st

torso = agent._torso
@tf.function
def dead(o):
    x = nets.base.preprocess_observation(o)
    h0 = tf.nn.relu(torso._conv0(x)); h1 = tf.nn.relu(torso._conv1(h0))
    f = tf.nn.relu(torso._linear(snt.Flatten()(h1)))
    d = lambda h: tf.reduce_mean(tf.cast(tf.reduce_all(tf.reshape(h, [-1, h.shape[-1]]) <= 0, axis=0), tf.float32))
    return d(h0), d(h1), d(f)

def vis_reward(e, act):
    ram = e.unwrapped.ale.getRAM()
    up = int(act) in (2, 4)
    down = int(act) in (3, 5)
    above = int(ram[54]) < int(ram[51])
    return float((up and above) or (down and not above))
rets, frames, t0, k = [], 0, time.time(), 0
first = np.ones(a.n, bool)
while frames < a.frames:
    ob = np.zeros((a.T + 1,) + obs.shape, np.uint8); fi = np.zeros((a.T + 1, a.n), bool)
    ac = np.zeros((a.T, a.n), np.int32); rw = np.zeros((a.T, a.n), np.float32); dn = np.zeros((a.T, a.n), bool)
    bl = np.zeros((a.T, a.n, spec.num_actions), np.float32)
    ob[0] = obs; fi[0] = first
    for t in range(a.T):
        out = step(tf.constant(obs))
        act = out.action.numpy(); bl[t] = out.policy_logits.numpy()
        for i, e in enumerate(E):
            o, r, te, tr, info = e.step(int(act[i]))
            d = te or tr
            if d: o, _ = e.reset()
            if "episode" in info: rets.append(info["episode"]["r"])
            obs[i] = o; first[i] = d; rw[t, i] = (float(act[i] == 2) if a.fake == 1 else (vis_reward(e, act[i]) if a.fake == 2 else r)); dn[t, i] = d
        ac[t] = act; ob[t + 1] = obs; fi[t + 1] = first
    for _ in range(a.K):
      st = train({"observation": tf.constant(ob), "first": tf.constant(fi), "action": tf.constant(ac),
                "reward": tf.constant(rw), "done": tf.constant(dn), "behaviour_logits": tf.constant(bl)})
    frames += 4 * a.T * a.n; k += 1
    if k % a.every == 1:
        d0, d1, df = [float(x) for x in dead(tf.constant(ob.reshape((-1,) + ob.shape[2:])))]
        print("mean reward %.2f | " % float(np.mean(rw)), end="")
        print("upd %5d frames %8d %5.0fs fps %5.0f | ret20 %6.2f (%d eps) | ent %.3f gn %.1f | dead conv0 %.2f conv1 %.2f fc %.2f"
              % (k, frames, time.time() - t0, frames / (time.time() - t0), np.mean(rets[-20:]) if rets else np.nan,
                 len(rets), float(st["entropy"]), float(st["grad_norm"]), d0, d1, df), flush=True)
