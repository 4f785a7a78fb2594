"""WALL-E's PPO agent: the policy and value update, GAE and the observation and reward
normalisers. The training loop that drives it is training.py; its flags are cli.py.

One update, from one iteration's rollouts and the params the samplers acted with:
  obs normalised with the stats in params (what the samplers used), clipped to +-obs_clip
  GAE(gamma 0.995, lambda 0.98) on rewards * (1 - gamma), bootstrapping V at truncations
  policy update: --loss kl (WALL-E; default) or --loss clip
  value fit on this batch and the previous one (10 epochs, minibatch 256)
  normaliser updated with this batch's raw observations -> next version

--loss kl, as in the TRPO/PPO code WALL-E derives from: up to 20 full-batch
Adam steps on
    -mean(A * ratio) + beta * KL + 50 * max(0, KL - 2 * kl_targ)^2
stopping early once KL > 4 * kl_targ; then beta (and the learning rate, when
beta saturates) adapt so that KL stays near kl_targ (0.003).
--loss clip: the clipped surrogate -mean(min(ratio * A, clip(ratio, 1 +- eps) * A)),
--clip_epochs passes over shuffled minibatches of --clip_minibatch.

rl-baselines3-zoo's tuned SB3 PPO (bench/ppo_halfcheetah.py's `zoo` variant)
runs with these options, all off by default:
  --hidden 256,256 --activation relu --log_std_init -2   SB3's MlpPolicy nets
      (nets/gaussian.py: torch-default init, a plain log-std variable)
  --norm_reward   GAE on rewards / running std of the discounted return, clipped
      to +-10 (SB3's VecNormalize; RewardNormaliser, in the learner)
  --value_fit joint (--loss clip)   one Adam (--adam_eps) over both nets on
      clipped surrogate - ent_coef * entropy + vf_coef * value MSE per minibatch,
      advantages normalised per minibatch, one global-norm gradient clip;
      no separate value fit
The observation normaliser stays per iteration (SB3 updates it at every step).
"""
import math

import numpy as np
import sonnet as snt
import tensorflow as tf

from walle import samplers as samplers_lib
from walle.config import parse_hidden
from nets.gaussian import GaussianPolicy, ValueNet, gaussian_entropy, gaussian_kl, gaussian_log_prob

KL_HINGE_COEF = 50.0  # "eta": weight of the hinge on KL above 2 * kl_targ
BETA_RANGE = (1.0 / 35.0, 35.0)
LR_MULTIPLIER_RANGE = (0.1, 10.0)
VALUE_MINIBATCH = 256
REWARD_CLIP = 10.0  # --norm_reward: SB3 VecNormalize's clip_reward


# ---------------------------------------------------------------------------
# Observation and reward normalisers, GAE (numpy).


class RunningMeanStd:
    """Running mean and variance (parallel update of Chan et al.) of observations
    (dim = obs_dim) or of a scalar (dim = ()). count > 0 starts from a prior of
    mean 0, variance 1 weighing `count` samples, as SB3's RunningMeanStd (1e-4);
    count 0 takes the first batch's moments as they are."""

    def __init__(self, dim, count=0.0):
        self.mean = np.zeros(dim, np.float64)
        self.var = np.ones(dim, np.float64)
        self.count = count

    def update(self, x):
        x = np.asarray(x, np.float64)
        n, mean, var = len(x), x.mean(axis=0), x.var(axis=0)
        if n == 0:
            return
        if self.count == 0:
            self.mean, self.var, self.count = mean, var, n
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + var * n + delta ** 2 * self.count * n / total) / total
        self.count = total

    def std(self):
        return np.sqrt(self.var + 1e-8)


class RewardNormaliser:
    """--norm_reward: SB3 VecNormalize's reward scaling, in the learner.

    Per sampler (its rank), ret = gamma * ret + reward at each step, reset to 0
    when an episode ends (terminated or time limit; not at the cut between two
    iterations, where the episode goes on). One running variance of ret over all
    samplers (prior count 1e-4, as SB3); each reward is divided by its std,
    updated with that step first, and clipped to +-REWARD_CLIP. Step t of every
    sampler's rollout is one update, as VecNormalize over n envs would do it.
    The samplers only collect raw rewards: one statistic for the whole run,
    whatever -n, and the same numbers as one sampler stepping n envs.
    """

    def __init__(self, gamma, clip=REWARD_CLIP):
        self.gamma, self.clip = gamma, clip
        self.rms = RunningMeanStd((), count=1e-4)
        self.returns = {}  # sampler rank -> discounted return of its episode so far

    def __call__(self, rollouts):
        """Normalised rewards, one float32 array per rollout; updates the statistics."""
        out = [np.empty(len(r["reward"]), np.float32) for r in rollouts]
        ends = [r["terminated"] | r["truncated"] for r in rollouts]
        for end, r in zip(ends, rollouts):
            end[-1] = end[-1] and not r["cut"]
        for t in range(max(len(r["reward"]) for r in rollouts)):
            live = [i for i, r in enumerate(rollouts) if t < len(r["reward"])]
            rets = np.array([self.gamma * self.returns.get(rollouts[i]["rank"], 0.0)
                             + float(rollouts[i]["reward"][t]) for i in live])
            self.rms.update(rets)
            for i, ret in zip(live, rets):
                out[i][t] = np.clip(rollouts[i]["reward"][t] / self.rms.std(), -self.clip, self.clip)
                self.returns[rollouts[i]["rank"]] = 0.0 if ends[i][t] else ret
        return out


def compute_gae(rewards, values, next_values, dones, gamma, lam):
    """Generalised advantage estimates for one time-ordered segment.

    next_values[t]: V of the state after step t (0 where the episode terminated,
    V(bootstrap obs) where it was truncated); dones[t]: the episode ended after
    step t (terminated or truncated), which stops the lambda recursion.
    Returns (advantages, returns = advantages + values).
    """
    deltas = rewards + gamma * next_values - values
    advantages = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = deltas[t] + gamma * lam * (1.0 - dones[t]) * running
        advantages[t] = running
    return advantages.astype(np.float32), (advantages + values).astype(np.float32)


# ---------------------------------------------------------------------------
# The agent.


class PPO:
    """The policy and value nets, their optimisers and the observation normaliser. `args` are the
    parsed flags of cli.py; params() is what the samplers act with, update() learns from their
    rollouts and moves to the next version."""

    def __init__(self, obs_dim, act_dim, args):
        self.args = args
        tf.random.set_seed(args.seed)
        self.rng = np.random.default_rng(args.seed)
        hidden = parse_hidden(args.hidden)
        self.policy = GaussianPolicy(obs_dim, act_dim, hid_mult=args.hid_mult, init_logvar=args.init_logvar,
                                     hidden=hidden, activation=args.activation,
                                     log_std_init=0.0 if args.log_std_init is None else args.log_std_init)
        self.value = ValueNet(obs_dim, hid_mult=args.hid_mult, hidden=hidden, activation=args.activation)
        self.normaliser = RunningMeanStd(obs_dim)
        self.reward_normaliser = RewardNormaliser(args.gamma) if args.norm_reward else None
        self._make_optimizers()
        self.beta, self.lr_multiplier, self.version = 1.0, 1.0, 0
        self.previous = None  # last batch's (obs, value targets): replayed in the value fit
        self._kl_step = tf.function(self._kl_step_impl, reduce_retracing=True)
        self._clip_step = tf.function(self._clip_step_impl, reduce_retracing=True)
        self._joint_epoch = tf.function(self._joint_epoch_impl, reduce_retracing=True)
        self._value_step = tf.function(self._value_step_impl, reduce_retracing=True)
        self._policy_stats = tf.function(self._policy_stats_impl, reduce_retracing=True)
        self._values = tf.function(self.value, reduce_retracing=True)
        self._policy_dist = tf.function(self.policy, reduce_retracing=True)

    def _make_optimizers(self):
        """--value_fit separate: a policy Adam and a value Adam; joint: one Adam over both nets."""
        args = self.args
        default_lr = 9e-4 / math.sqrt(self.policy.widths[1]) if args.loss == "kl" else 3e-4
        self.base_lr = args.policy_lr or default_lr
        self.lr = tf.Variable(self.base_lr, trainable=False, dtype=tf.float32)
        if args.value_fit == "joint":
            self.joint_opt = snt.optimizers.Adam(self.lr, epsilon=args.adam_eps)
            return
        self.policy_opt = snt.optimizers.Adam(self.lr, epsilon=args.adam_eps)
        value_lr = args.value_lr or (1e-2 / math.sqrt(self.value.widths[1]))
        self.value_opt = snt.optimizers.Adam(value_lr, epsilon=args.adam_eps)

    def params(self):
        """What the samplers need: numpy weights, normaliser stats and the version."""
        return dict(self.policy.numpy_params(), version=self.version,
                    obs_mean=self.normaliser.mean.astype(np.float32),
                    obs_std=self.normaliser.std().astype(np.float32), obs_clip=self.args.obs_clip)

    def state(self):
        """The agent's numpy side, for walle.checkpoint (the nets and optimizers go in TensorFlow's
        checkpoint). The reward normaliser's per-sampler returns are left out: a resumed run's
        samplers start new episodes."""
        norm = self.reward_normaliser
        return {"obs_normaliser": dict(vars(self.normaliser)),
                "reward_rms": None if norm is None else dict(vars(norm.rms)),
                "beta": self.beta, "lr_multiplier": self.lr_multiplier, "version": self.version,
                "previous": self.previous, "rng": self.rng.bit_generator.state}

    def set_state(self, state):
        """Undoes state(): the agent as it was when the checkpoint was written."""
        vars(self.normaliser).update(state["obs_normaliser"])
        if self.reward_normaliser is not None and state["reward_rms"] is not None:
            vars(self.reward_normaliser.rms).update(state["reward_rms"])
        self.beta, self.lr_multiplier, self.version = state["beta"], state["lr_multiplier"], state["version"]
        self.previous = state["previous"]
        self.rng.bit_generator.state = state["rng"]

    # -- losses, one tf.function step each --------------------------------

    def _policy_stats_impl(self, obs, act, adv, old_mean, old_logvar, old_logp):
        mean, logvar = self.policy(obs)
        ratio = tf.exp(gaussian_log_prob(act, mean, logvar) - old_logp)
        kl = tf.reduce_mean(gaussian_kl(old_mean, old_logvar, mean, logvar))
        clipped = tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > self.args.clip, tf.float32))
        return kl, gaussian_entropy(logvar), -tf.reduce_mean(adv * ratio), clipped

    def _kl_step_impl(self, obs, act, adv, old_mean, old_logvar, old_logp, beta):
        kl_targ = self.args.kl_targ
        with tf.GradientTape() as tape:
            mean, logvar = self.policy(obs)
            ratio = tf.exp(gaussian_log_prob(act, mean, logvar) - old_logp)
            kl = tf.reduce_mean(gaussian_kl(old_mean, old_logvar, mean, logvar))
            loss = (-tf.reduce_mean(adv * ratio) + beta * kl
                    + KL_HINGE_COEF * tf.square(tf.maximum(0.0, kl - 2.0 * kl_targ)))
        variables = self.policy.trainable_variables
        self.policy_opt.apply(tape.gradient(loss, variables), variables)
        return loss

    def _clip_step_impl(self, obs, act, adv, old_logp):
        eps = self.args.clip
        with tf.GradientTape() as tape:
            mean, logvar = self.policy(obs)
            ratio = tf.exp(gaussian_log_prob(act, mean, logvar) - old_logp)
            surrogate = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1.0 - eps, 1.0 + eps) * adv)
            loss = -tf.reduce_mean(surrogate) - self.args.ent_coef * gaussian_entropy(logvar)
        variables = self.policy.trainable_variables
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, variables), self.args.max_grad_norm)
        self.policy_opt.apply(grads, variables)
        return loss

    def _joint_loss(self, obs, act, adv, old_logp, ret):
        """SB3's PPO loss on one minibatch: advantages normalised here (unbiased std),
        clipped surrogate - ent_coef * entropy + vf_coef * unclipped value MSE."""
        args = self.args
        adv_mean, adv_var = tf.nn.moments(adv, axes=[0])
        n = tf.cast(tf.size(adv), tf.float32)
        adv = (adv - adv_mean) / (tf.sqrt(adv_var * n / (n - 1.0)) + 1e-8)
        mean, logvar = self.policy(obs)
        ratio = tf.exp(gaussian_log_prob(act, mean, logvar) - old_logp)
        clipped = tf.clip_by_value(ratio, 1.0 - args.clip, 1.0 + args.clip)
        policy_loss = -tf.reduce_mean(tf.minimum(ratio * adv, clipped * adv))
        value_loss = tf.reduce_mean(tf.square(ret - self.value(obs)))
        loss = policy_loss - args.ent_coef * gaussian_entropy(logvar) + args.vf_coef * value_loss
        return loss, value_loss

    def _joint_step_impl(self, obs, act, adv, old_logp, ret):
        """One Adam step on both nets, gradients clipped to --max_grad_norm by their global norm."""
        with tf.GradientTape() as tape:
            loss, value_loss = self._joint_loss(obs, act, adv, old_logp, ret)
        variables = self.policy.trainable_variables + self.value.trainable_variables
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, variables), self.args.max_grad_norm)
        self.joint_opt.apply(grads, variables)
        return loss, value_loss

    def _joint_epoch_impl(self, obs, act, adv, old_logp, ret, minibatches):
        """One pass: a joint step on each row of minibatches [k, size] (indices into the batch),
        in order, in one call (k is static: the loop is unrolled); the k value losses."""
        value_losses = []
        for i in range(minibatches.shape[0]):
            _, value_loss = self._joint_step_impl(*(tf.gather(x, minibatches[i]) for x in (obs, act, adv, old_logp, ret)))
            value_losses.append(value_loss)
        return tf.stack(value_losses)

    def _value_step_impl(self, obs, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.value(obs) - targets))
        variables = self.value.trainable_variables
        self.value_opt.apply(tape.gradient(loss, variables), variables)
        return loss

    # -- one update from one iteration's rollouts ---------------------------

    def _rewards(self, rollouts):
        """Rewards for GAE: WALL-E's reward * (1 - gamma), or --norm_reward's normalised rewards."""
        if self.reward_normaliser is not None:
            return self.reward_normaliser(rollouts)
        return [r["reward"] * (1.0 - self.args.gamma) for r in rollouts]

    def _advantages(self, rollouts, params):
        """Normalised obs, actions, advantages and value targets, over all rollouts."""
        gamma, lam = self.args.gamma, self.args.lam
        norm = (params["obs_mean"], params["obs_std"], params["obs_clip"])
        parts = []
        for r, rewards in zip(rollouts, self._rewards(rollouts)):
            obs = samplers_lib.normalise_obs(r["obs"], *norm)
            values = self._values(obs).numpy()
            next_values = np.zeros_like(values)
            next_values[:-1] = values[1:]
            next_values[r["terminated"]] = 0.0
            if len(r["bootstrap_obs"]):
                boot = samplers_lib.normalise_obs(r["bootstrap_obs"], *norm)
                next_values[r["truncated"]] = self._values(boot).numpy()
            dones = (r["terminated"] | r["truncated"]).astype(np.float32)
            if not dones[-1]:
                raise ValueError(f"rollout of sampler {r['rank']} does not end terminated or truncated")
            adv, ret = compute_gae(rewards, values, next_values, dones, gamma, lam)
            parts.append((obs, r["action"], adv, ret, values))
        return [np.concatenate(x) for x in zip(*parts)]

    def update(self, rollouts, params, lr_scale=1.0):
        """One iteration's update, the policy's rate times lr_scale (--lr_decay); returns its stats
        (a progress.csv row's learning columns)."""
        for r in rollouts:
            if r["version"] != params["version"]:
                raise ValueError(f"rollout of sampler {r['rank']} has policy version {r['version']}, "
                                 f"expected {params['version']}")
        obs, act, adv, ret, values = self._advantages(rollouts, params)
        adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        old_mean, old_logvar = (t.numpy() for t in self._policy_dist(obs))
        old_logp = gaussian_log_prob(act, old_mean, old_logvar).numpy()
        batch = [tf.constant(x) for x in (obs, act, adv, old_mean, old_logvar, old_logp)]
        self.lr.assign(self.base_lr * self.lr_multiplier * lr_scale)
        epochs_run, value_loss = self._update_policy(batch, tf.constant(ret))
        kl, entropy, policy_loss, clip_fraction = (float(x) for x in self._policy_stats(*batch))
        if self.args.value_fit == "separate":
            value_loss = self._fit_value(obs, ret)
        explained = 1.0 - np.var(ret - values) / (np.var(ret) + 1e-8)
        self.normaliser.update(np.concatenate([r["obs"] for r in rollouts]))
        self.version += 1
        return {"kl": kl, "entropy": entropy, "beta": self.beta, "lr_multiplier": self.lr_multiplier,
                "policy_epochs": epochs_run, "clip_fraction": clip_fraction, "policy_loss": policy_loss,
                "value_loss": value_loss, "explained_variance": float(explained)}

    def _update_policy(self, batch, ret):
        """--loss kl, --loss clip, or --loss clip with --value_fit joint (which fits the value net
        too); returns (epochs run, the joint value loss or None)."""
        if self.args.loss == "kl":
            return self._kl_epochs(batch), None
        if self.args.value_fit == "separate":
            def clip_epoch(minibatches):
                for idx in minibatches:
                    self._clip_step(*(tf.gather(batch[i], idx) for i in (0, 1, 2, 5)))
            return self._minibatch_epochs(batch, clip_epoch), None
        joint_batch, value_losses = (batch[0], batch[1], batch[2], batch[5], ret), []

        def joint_epoch(minibatches):  # one TensorFlow call per pass, not one per minibatch
            value_losses.append(self._joint_epoch(*joint_batch, tf.constant(minibatches)).numpy())

        epochs_run = self._minibatch_epochs(batch, joint_epoch)
        return epochs_run, float(np.mean(value_losses[-1]))

    def _kl_epochs(self, batch):
        """Up to --policy_epochs full-batch steps, then beta and the learning rate adapt."""
        args = self.args
        epochs_run = 0
        for _ in range(args.policy_epochs):
            self._kl_step(*batch, tf.constant(self.beta, tf.float32))
            epochs_run += 1
            kl = float(self._policy_stats(*batch)[0])
            if kl > 4.0 * args.kl_targ:
                break  # far past the target: stop early
        if kl > 2.0 * args.kl_targ:
            self.beta = min(BETA_RANGE[1], 1.5 * self.beta)
            if self.beta > 30.0 and self.lr_multiplier > LR_MULTIPLIER_RANGE[0]:
                self.lr_multiplier /= 1.5
        elif kl < 0.5 * args.kl_targ:
            self.beta = max(BETA_RANGE[0], self.beta / 1.5)
            if self.beta < 1.0 / 30.0 and self.lr_multiplier < LR_MULTIPLIER_RANGE[1]:
                self.lr_multiplier *= 1.5
        return epochs_run

    def _minibatch_epochs(self, batch, epoch):
        """--clip_epochs passes, each calling epoch(minibatches [k, size]) with a shuffle of the
        batch cut into minibatches of --clip_minibatch (a remainder left out); stops early above
        --target_kl."""
        args = self.args
        n, size = len(batch[0]), min(args.clip_minibatch, len(batch[0]))
        epochs_run = 0
        for _ in range(args.clip_epochs):
            order = self.rng.permutation(n)
            epoch(order[:n // size * size].reshape(n // size, size))
            epochs_run += 1
            if args.target_kl and float(self._policy_stats(*batch)[0]) > args.target_kl:
                break
        return epochs_run

    def _fit_value(self, obs, targets):
        """Minibatch regression on this batch plus the previous one."""
        x, y = obs, targets
        if self.previous is not None:
            x, y = np.concatenate([obs, self.previous[0]]), np.concatenate([targets, self.previous[1]])
        self.previous = (obs, targets)
        num_batches = max(len(x) // VALUE_MINIBATCH, 1)
        size = len(x) // num_batches
        x, y = tf.constant(x), tf.constant(y)
        losses = []
        for _ in range(self.args.value_epochs):
            order = self.rng.permutation(len(x))
            for b in range(num_batches):
                idx = order[b * size:(b + 1) * size]
                losses.append(float(self._value_step(tf.gather(x, idx), tf.gather(y, idx))))
        return float(np.mean(losses[-num_batches:]))
