"""How alive is a SimpleConvNetAgent checkpoint on Pong (diagnosis tool)?

  .venv/bin/python bench/inspect_checkpoint.py results/<run>/checkpoints/ckpt-N [--size 84]
  .venv/bin/python bench/inspect_checkpoint.py init          # a freshly initialised net

Plays 600 steps of PongNoFrameskip-v4 with the policy and prints, per layer, how many ReLU
channels are ever active on those frames and how many vary across them, how much the
policy's probabilities vary across frames (0: the policy ignores the screen) and the
baseline's mean and spread, then the norm of every variable.
"""
import sys
import numpy as np, tensorflow as tf, sonnet as snt
import envs, nets
ck = sys.argv[1]
tf.random.set_seed(0)
size = int(sys.argv[sys.argv.index("--size") + 1]) if "--size" in sys.argv else 84
agent = nets.make_agent("SimpleConvNetAgent", 6, (size, size, 4))
env = envs.make_env("PongNoFrameskip-v4", seed=5, screen_size=size)
o, _ = env.reset(seed=5)
agent(tf.constant(o[None]), tf.ones([1], bool), ())
if ck != "init":
    tf.train.Checkpoint(agent=agent).restore(ck).expect_partial()
obs = []
for i in range(600):
    out, _ = agent(tf.constant(o[None]), tf.ones([1], bool), ())
    o, r, te, tr, _ = env.step(int(out.action.numpy()[0]))
    if te or tr: o, _ = env.reset()
    obs.append(o)
x = nets.base.preprocess_observation(np.array(obs))
t = agent._torso
h0 = tf.nn.relu(t._conv0(x)); h1 = tf.nn.relu(t._conv1(h0)); f = tf.nn.relu(t._linear(snt.Flatten()(h1)))
out, _ = agent(tf.constant(np.array(obs)), tf.ones([600], bool), ())
def stats(name, h):
    h = tf.reshape(h, [600, -1, h.shape[-1]]).numpy()  # frames, positions, channels
    active = (h > 0).any(axis=(0, 1))
    var = h.reshape(600, -1, h.shape[-1]).std(axis=0).mean(axis=0)  # per-channel std across frames
    print("%s: %d/%d channels ever active; channels varying across frames (std>1e-3): %d" % (
        name, active.sum(), len(active), (var > 1e-3).sum()))
stats("conv0", h0); stats("conv1", h1); stats("fc", f[:, None, :])
lg = out.policy_logits.numpy(); p = tf.nn.softmax(lg).numpy()
print("policy: mean probs", np.round(p.mean(0), 3), "std of probs across frames", np.round(p.std(0), 3))
print("baseline: mean %.3f std %.3f" % (out.baseline.numpy().mean(), out.baseline.numpy().std()))
for v in agent.trainable_variables: print(v.name, v.shape, "norm %.3f" % float(tf.norm(v)))
