"""Experience replay for the IMPALA learner: mixes live unrolls with replayed ones.

Configured by `--replay_parameters`, a JSON list with one entry per source, as in
the PyTorch V-trace platform of "General distributed RL platform based on modified
IMPALA architecture" (single-node, with experience replay, attentive experience
replay and elite experience replay; "the platform" below). Every entry has "type",
"capacity" (in unrolls, the "items" here) and "sample_ratio" (the share of each
training batch the source supplies; the ratios sum to 1):

  queue     Live unrolls straight from the actors: the on-policy part of the
            batch. FIFO; at most `capacity` live unrolls that did not fit into
            a batch are carried over to the next one, older leftovers are
            dropped (they are still in the replay buffers). The platform uses
            capacity 1; a large capacity only makes the "live" data stale.
            `[{"type": "queue", "capacity": 1, "sample_ratio": 1}]` = no replay.
  standard  Classic experience replay (Lin 1992; Mnih et al. 2015): uniform
            sampling, the oldest unroll is replaced when full (FIFO).
  custom    A replay with a prioritised strategy (the platform's):
            sample_strategy "elite_sampling" -- Elite experience replay
              (the platform's). Each unroll keeps the behaviour policy's
              state-feature vectors (its `behaviour_logits` [T, A]). Draw
              lambda_batch_multiplier x n random candidates, recompute their
              features under the *current* policy (`features_fn`), measure how
              far off-policy each one is with `dist_function`, then pick n:
                strategy 1: the n with the lowest distance;
                strategy 2: sort by distance, split into n subsets, take the
                            lowest of each (keeps some diversity);
                strategy 3: as 1, but the least-sampled first: order by
                            (times sampled, distance);
                strategy 4: as 2, but in each subset the least-sampled first.
            sample_strategy "attentive_sampling" -- Attentive experience replay
              (Sun, Zhou and Li, AAAI 2020, "Attentive Experience Replay"):
              the same candidates and strategies, but the distance is between
              a candidate's current-policy features and the mean
              current-policy feature vector of the live batch, so the stored
              unrolls most similar to the states the agent visits now win.
              (The platform compares with the last state of the newest unroll;
              the mean over the live batch is less noisy.)
            sample_strategy "uniform" (default) -- as standard.
            insert_strategy "elite_insertion" (the platform's): when full, draw
              max(elite_batch_size, k) stored unrolls for the k new ones and
              overwrite the k most off-policy of them; default "fifo".

Distances (all averaged over the T steps of an unroll; x = current-policy
logits, y = behaviour logits or the attentive reference):
  ln_norm   ||x_t - y_t||_p, p = "p" (default 2);
  cos_dist  1 - cos(x_t, y_t);
  kl_div    KL(pi_y(.|t) || pi_x(.|t)), the expected log-ratio of behaviour over
            current policy under the data's own distribution, for the policy's
            kind (float actions: a diagonal Gaussian, whose parameters are the
            means, then the log-stds; integer actions: a softmax of the logits).

`alfa_annealing_factor` keeps the platform's meaning: it anneals the candidate
multiplier, lambda_u = max(1, lambda - u * (lambda - 1) / (alfa * total_updates))
after u sample calls, so with alfa = 1 the pool shrinks to plain uniform
sampling by the end of training and with alfa = 2 to half-way. Without
`total_updates` (ReplayMixer argument) lambda stays constant.

Optional `"compress": true` (standard/custom) stores observations lz4
compressed (as the platform's replay compression does); `nbytes()` reports the payload
bytes actually held (arrays and compressed blocks, not Python object headers).

Use from the learner (single thread; not thread-safe):

    specs = parse_replay_parameters(flags.replay_parameters)
    mixer = ReplayMixer(specs, flags.batch_size, seed=flags.seed + rank)
    live = split_batch(batch)                 # the B unrolls just dequeued
    items = mixer.sample(live, features_fn)   # sample first: replay holds only older data
    mixer.add(live, features_fn)              # every live unroll into every buffer
    train_batch = stack_items(items)

Returned items are read-only; `stack_items` copies. Numpy (and lz4) only.
"""
import difflib
import json
import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import lz4.block
import numpy as np

TYPES = ("queue", "standard", "custom")
DIST_FUNCTIONS = ("ln_norm", "cos_dist", "kl_div")
SAMPLE_STRATEGIES = ("uniform", "elite_sampling", "attentive_sampling")
INSERT_STRATEGIES = ("fifo", "elite_insertion")
ELITE_STRATEGIES = (1, 2, 3, 4)
COMPRESSED_KEYS = ("observation", "frames")
EXAMPLE = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
           '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]')

_COMMON_KEYS = ("type", "capacity", "sample_ratio")
_KEYS = {
    "queue": _COMMON_KEYS,
    "standard": _COMMON_KEYS + ("compress",),
    "custom": _COMMON_KEYS + ("compress", "sample_strategy", "insert_strategy", "dist_function", "p",
                              "lambda_batch_multiplier", "alfa_annealing_factor",
                              "elite_sampling_strategy", "elite_batch_size"),
}


class ReplayConfigError(ValueError):
    """A bad --replay_parameters value; the message says where and what would be right."""


@dataclass(frozen=True)
class ReplaySpec:
    type: str
    capacity: int
    sample_ratio: float
    compress: bool = False
    sample_strategy: str = "uniform"
    insert_strategy: str = "fifo"
    dist_function: str = "ln_norm"
    p: float = 2.0
    lambda_batch_multiplier: float = 1.0
    alfa_annealing_factor: float = 1.0
    elite_sampling_strategy: int = 1
    elite_batch_size: int = 20


# ------------------------------------------------------------------ parsing
def parse_replay_parameters(text):
    """The --replay_parameters JSON text -> list of ReplaySpec, or one ReplayConfigError."""
    if isinstance(text, str):
        try:
            entries = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as e:
            raise ReplayConfigError(
                "--replay_parameters is not valid JSON (%s at line %d column %d): %r; expected a list "
                "like %s" % (e.msg, e.lineno, e.colno, text, EXAMPLE)) from None
    else:
        entries = text
    if not isinstance(entries, list):
        raise ReplayConfigError("--replay_parameters must be a JSON list of replay entries, got a %s; "
                                "e.g. %s" % (_json_type(entries), EXAMPLE))
    if not entries:
        raise ReplayConfigError("--replay_parameters is an empty list; it needs at least one entry, e.g. "
                                '[{"type": "queue", "capacity": 1, "sample_ratio": 1}] (no replay)')
    specs = [_parse_entry(i, e) for i, e in enumerate(entries)]
    check_specs(specs)
    return specs


def check_specs(specs):
    """Checks across entries: at most one queue, ratios summing to 1."""
    queues = [i for i, s in enumerate(specs) if s.type == "queue"]
    if len(queues) > 1:
        raise ReplayConfigError(
            '--replay_parameters entries %s all have "type": "queue"; at most one queue (the live '
            'unrolls) is allowed -- merge them into one with the summed "sample_ratio"'
            % ", ".join(map(str, queues)))
    total = sum(s.sample_ratio for s in specs)
    if abs(total - 1.0) > 1e-6:
        raise ReplayConfigError(
            '--replay_parameters: the "sample_ratio" values must sum to 1, they sum to %.6g (%s); '
            "e.g. %s" % (total, " + ".join("%g" % s.sample_ratio for s in specs), EXAMPLE))


def _no_duplicate_keys(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ReplayConfigError('--replay_parameters: key "%s" appears twice in one entry' % k)
        seen[k] = v
    return seen


def _json_type(v):
    return {dict: "JSON object", list: "list", str: "string", bool: "boolean",
            type(None): "null"}.get(type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _parse_entry(i, entry):
    """One entry of the list -> ReplaySpec, or a ReplayConfigError naming the entry and the key."""
    fields = _Entry(i, entry)
    typ = fields.type()
    spec = {"type": typ, "capacity": fields.integer("capacity", None, 1),
            "sample_ratio": fields.number("sample_ratio", None, lambda r: 0.0 < r <= 1.0, "in (0, 1]")}
    if "compress" in entry:
        spec["compress"] = fields.boolean("compress")
    if typ == "custom":
        spec.update(_custom_fields(fields))
    return ReplaySpec(**spec)


class _Entry:
    """Typed reads of one --replay_parameters entry, each failing with a message that names the
    entry, its type and the key, and says what would be right."""

    def __init__(self, i, entry):
        self.where, self.entry = "--replay_parameters entry %d" % i, entry
        if not isinstance(entry, dict):
            raise ReplayConfigError('%s must be a JSON object like {"type": "standard", "capacity": 1000, '
                                    '"sample_ratio": 0.5}, got a %s' % (self.where, _json_type(entry)))

    def fail(self, key, what):
        return ReplayConfigError('%s: "%s" %s' % (self.where, key, what))

    def type(self):
        """The entry's type, after checking that every key belongs to it and the common keys are there."""
        if "type" not in self.entry:
            raise self.fail("type", "is missing; choose one of %s" % _choices(TYPES))
        typ = self.entry["type"]
        if typ not in TYPES:
            raise self.fail("type", "is %s; choose one of %s" % (json.dumps(typ), _choices(TYPES)))
        self.where += " (%s)" % typ
        for key in self.entry:
            if key not in _KEYS[typ]:
                close = difflib.get_close_matches(str(key), _KEYS[typ], n=1)
                hint = ' (did you mean "%s"?)' % close[0] if close else ""
                raise self.fail(key, "is not a known key for type %s%s; its keys are %s"
                                % (typ, hint, _choices(_KEYS[typ])))
        for key in ("capacity", "sample_ratio"):
            if key not in self.entry:
                raise self.fail(key, "is missing; every entry needs \"capacity\" (unrolls held, an integer "
                                     ">= 1) and \"sample_ratio\" (its share of each batch, in (0, 1])")
        return typ

    def integer(self, key, default, minimum):
        v = self.entry.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
            raise self.fail(key, "must be an integer >= %d, got %s (%s)" % (minimum, json.dumps(v), _json_type(v)))
        if v < minimum:
            raise self.fail(key, "must be an integer >= %d, got %s" % (minimum, json.dumps(v)))
        return int(v)

    def number(self, key, default, ok, what):
        v = self.entry.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(key, "must be a number %s, got %s (%s)" % (what, json.dumps(v), _json_type(v)))
        if not ok(float(v)):
            raise self.fail(key, "must be a number %s, got %s" % (what, json.dumps(v)))
        return float(v)

    def choice(self, key, default, choices):
        v = self.entry.get(key, default)
        if v not in choices:
            raise self.fail(key, "is %s; choose one of %s" % (json.dumps(v), _choices(choices)))
        return v

    def boolean(self, key):
        v = self.entry[key]
        if not isinstance(v, bool):
            raise self.fail(key, "must be true or false, got %s" % json.dumps(v))
        return v


def _custom_fields(fields):
    """The strategy keys of a custom entry: each only where its strategy uses it."""
    entry = fields.entry
    sample = fields.choice("sample_strategy", "uniform", SAMPLE_STRATEGIES)
    insert = fields.choice("insert_strategy", "fifo", INSERT_STRATEGIES)
    dist = fields.choice("dist_function", "ln_norm", DIST_FUNCTIONS)
    prioritised = sample != "uniform"
    for key in ("lambda_batch_multiplier", "alfa_annealing_factor", "elite_sampling_strategy"):
        if key in entry and not prioritised:
            raise fields.fail(key, 'only applies with "sample_strategy": "elite_sampling" or "attentive_sampling" '
                                   '(this entry samples uniformly)')
    if "elite_batch_size" in entry and insert != "elite_insertion":
        raise fields.fail("elite_batch_size", 'only applies with "insert_strategy": "elite_insertion"')
    if "dist_function" in entry and not prioritised and insert != "elite_insertion":
        raise fields.fail("dist_function", 'only applies with a prioritised "sample_strategy" or '
                                           '"insert_strategy": "elite_insertion"')
    if "p" in entry and dist != "ln_norm":
        raise fields.fail("p", 'is the order of "dist_function": "ln_norm"; this entry uses "%s"' % dist)
    strategy = _elite_strategy(fields, sample)
    return dict(
        sample_strategy=sample, insert_strategy=insert, dist_function=dist,
        p=fields.number("p", 2.0, lambda v: 1.0 <= v < math.inf, ">= 1"),
        lambda_batch_multiplier=fields.number("lambda_batch_multiplier", 1.0, lambda v: 1.0 <= v <= 1000.0,
                                              "in [1, 1000] (candidates drawn per sampled unroll)"),
        alfa_annealing_factor=fields.number("alfa_annealing_factor", 1.0, lambda v: 0.0 < v < math.inf, "> 0"),
        elite_sampling_strategy=strategy,
        elite_batch_size=fields.integer("elite_batch_size", 20, 1))


def _elite_strategy(fields, sample):
    """1-4, also written "strategy1" .. "strategy4"; 3 by default for elite sampling."""
    strategy = fields.entry.get("elite_sampling_strategy", 3 if sample == "elite_sampling" else 1)
    if isinstance(strategy, str) and strategy.lower() in ("strategy1", "strategy2", "strategy3", "strategy4"):
        strategy = int(strategy[-1])
    if isinstance(strategy, bool) or strategy not in ELITE_STRATEGIES:
        raise fields.fail("elite_sampling_strategy", "is %s; choose 1, 2, 3 or 4 (or \"strategy1\" .. "
                          "\"strategy4\")" % json.dumps(strategy))
    return int(strategy)


def _choices(names):
    return ", ".join(json.dumps(n) for n in names)


# ------------------------------------------------------------- item storage
class _Compressed(NamedTuple):
    data: bytes
    shape: tuple
    dtype: str


def _frozen_copy(v):
    """Own, read-only copy of a nest of arrays (a view would keep the whole batch alive)."""
    if isinstance(v, dict):
        return {k: _frozen_copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_frozen_copy(x) for x in v)
    a = np.array(v, copy=True)
    a.flags.writeable = False
    return a


def _pack(item, compress):
    out = {}
    for k, v in item.items():
        if compress and k in COMPRESSED_KEYS:
            a = np.ascontiguousarray(v)
            out[k] = _Compressed(lz4.block.compress(a.tobytes(), store_size=True), a.shape, a.dtype.str)
        else:
            out[k] = _frozen_copy(v)
    return out


def _unpack(stored):
    out = {}
    for k, v in stored.items():
        if isinstance(v, _Compressed):
            raw = lz4.block.decompress(v.data, return_bytearray=True)
            a = np.frombuffer(raw, dtype=np.dtype(v.dtype)).reshape(v.shape)
            a.flags.writeable = False
            out[k] = a
        else:
            out[k] = v
    return out


def _nbytes(v):
    if isinstance(v, _Compressed):
        return len(v.data)
    if isinstance(v, dict):
        return sum(_nbytes(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return sum(_nbytes(x) for x in v)
    return int(np.asarray(v).nbytes)


def split_batch(batch):
    """A batch dict of [B, ...] arrays -> list of B unroll dicts (views)."""
    sizes = {len(v) for v in batch.values()}
    if len(sizes) != 1:
        raise ValueError("split_batch: fields have different batch sizes %s" % sorted(sizes))
    return [{k: v[i] for k, v in batch.items()} for i in range(sizes.pop())]


def stack_items(items):
    """List of unroll dicts -> one batch dict of [B, ...] arrays (copies)."""
    def stack(*xs):
        x = xs[0]
        if isinstance(x, dict):
            return {k: stack(*(y[k] for y in xs)) for k in x}
        if isinstance(x, (list, tuple)):
            return type(x)(stack(*z) for z in zip(*xs))
        return np.stack(xs)
    return stack(*items)


# ---------------------------------------------------------------- distances
def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _kl(y, x, gaussian):
    """KL(p_y || p_x) per step, summed over the last axis: softmaxes of the logits y and x, or with
    `gaussian` diagonal Gaussians of parameters [means, log-stds] (nets/distributions.py's layout),
    in closed form: sum of log(s_x / s_y) + (s_y^2 + (m_y - m_x)^2) / (2 s_x^2) - 1/2."""
    if not gaussian:
        ly, lx = _log_softmax(y), _log_softmax(x)
        return np.sum(np.exp(ly) * (ly - lx), axis=-1)
    (my, ly), (mx, lx) = np.split(y, 2, axis=-1), np.split(x, 2, axis=-1)
    return np.sum(lx - ly + (np.exp(2 * ly) + (my - mx) ** 2) / (2 * np.exp(2 * lx)) - 0.5, axis=-1)


def _is_gaussian(items):
    """Whether the unrolls' policy is a diagonal Gaussian: float actions are a Gaussian's, integer
    ones a softmax's (as nets.distributions.of_batch decides; this module stays numpy only)."""
    return np.issubdtype(np.asarray(items[0]["action"]).dtype, np.floating)


def distances(current, reference, dist_function, p=2.0, gaussian=False):
    """Per-unroll distance, mean over time. current [N, T, A]; reference broadcastable to it.
    gaussian: kl_div reads A as a diagonal Gaussian's means and log-stds (_is_gaussian)."""
    x = np.asarray(current, np.float64)
    y = np.broadcast_to(np.asarray(reference, np.float64), x.shape)
    if dist_function == "ln_norm":
        d = np.sum(np.abs(x - y) ** p, axis=-1) ** (1.0 / p)
    elif dist_function == "cos_dist":
        norms = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1)
        d = 1.0 - np.sum(x * y, axis=-1) / np.maximum(norms, 1e-8)
    elif dist_function == "kl_div":
        d = _kl(y, x, gaussian)
    else:
        raise ValueError("unknown dist_function %r; choose one of %s" % (dist_function, _choices(DIST_FUNCTIONS)))
    return d.mean(axis=-1)


def pick(dist, counts, n, strategy):
    """Positions of the n candidates chosen by elite strategy 1-4 (the platform's), distinct.

    dist, counts: per candidate (len k >= n). Ties go to the earlier candidate.
    """
    k = len(dist)
    pos = np.arange(k)
    if strategy in (1, 3):
        order = np.lexsort((pos, dist)) if strategy == 1 else np.lexsort((pos, dist, counts))
        return order[:n]
    by_dist = np.lexsort((pos, dist))
    groups = np.array_split(by_dist, n)  # k >= n, so every subset is non-empty
    if strategy == 2:
        return np.array([g[0] for g in groups])
    return np.array([g[np.lexsort((dist[g], counts[g]))[0]] for g in groups])


# ------------------------------------------------------------------ sources
class _Queue:
    def __init__(self, index, spec):
        self.index, self.spec = index, spec
        self.name = "%d_queue" % index
        self.carry = []
        self.drawn = 0

    def nbytes(self):
        return sum(_nbytes(x) for x in self.carry)

    def stats(self):
        return {"type": "queue", "size": len(self.carry), "capacity": self.spec.capacity,
                "nbytes": self.nbytes(), "drawn": self.drawn}


class _Buffer:
    """A bounded store of packed unrolls with per-slot sample counts."""

    def __init__(self, index, spec, total_updates):
        self.index, self.spec, self.total_updates = index, spec, total_updates
        label = spec.type if spec.sample_strategy == "uniform" else spec.sample_strategy
        self.name = "%d_%s" % (index, label)
        cap = spec.capacity
        self.slots = [None] * cap
        self.slot_bytes = np.zeros(cap, np.int64)
        self.counts = np.zeros(cap, np.int64)
        self.size = 0
        self.pos = 0          # next FIFO slot once full
        self.newest = -1      # slot of the most recent insert
        self.added = 0
        self.drawn = 0
        self.from_live = 0
        self.calls = 0        # sample calls, for lambda annealing
        self.dist_picked = float("nan")
        self.dist_candidates = float("nan")

    def __len__(self):
        return self.size

    def nbytes(self):
        return int(self.slot_bytes.sum())

    def item(self, slot):
        return _unpack(self.slots[slot])

    def lam(self):
        s = self.spec
        if self.total_updates is None or s.lambda_batch_multiplier <= 1.0:
            return s.lambda_batch_multiplier
        step = (s.lambda_batch_multiplier - 1.0) / (s.alfa_annealing_factor * self.total_updates)
        return max(1.0, s.lambda_batch_multiplier - self.calls * step)

    def _put(self, slot, item):
        self.slots[slot] = _pack(item, self.spec.compress)
        self.slot_bytes[slot] = _nbytes(self.slots[slot])
        self.counts[slot] = 0
        self.newest = slot

    def add(self, items, rng, features_fn):
        cap = self.spec.capacity
        self.added += len(items)
        items = list(items)[-cap:]  # earlier ones would be overwritten within this call anyway
        while items and self.size < cap:
            self._put(self.size, items.pop(0))
            self.size += 1
        if not items:
            return
        if self.spec.insert_strategy == "elite_insertion":
            k = min(self.size, max(len(items), self.spec.elite_batch_size))
            cand = rng.choice(self.size, k, replace=False)
            d = self._off_policy([self.item(int(c)) for c in cand], features_fn,
                                 "insert_strategy elite_insertion", "add")
            victims = cand[np.lexsort((np.arange(k), -d))[:len(items)]]  # most off-policy first
            for slot, item in zip(victims, items):
                self._put(int(slot), item)
        else:
            for item in items:
                self._put(self.pos, item)
                self.pos = (self.pos + 1) % cap

    def _features(self, items, features_fn, why, method):
        if features_fn is None:
            raise ValueError("replay source %s (%s) needs features_fn(items) -> list of [T, A] current-policy "
                             "logits; pass it to ReplayMixer.%s()" % (self.name, why, method))
        feats = [np.asarray(f) for f in features_fn(items)]
        if len(feats) != len(items):
            raise ValueError("features_fn returned %d feature arrays for %d unrolls" % (len(feats), len(items)))
        want = np.shape(items[0]["behaviour_logits"])
        for f in feats:
            if f.shape != want:
                raise ValueError("features_fn returned an array of shape %s; expected %s, the shape of "
                                 "behaviour_logits [T, A]" % (f.shape, want))
        return np.stack(feats), [np.asarray(it["behaviour_logits"]) for it in items]

    def _off_policy(self, items, features_fn, why, method):
        cur, beh = self._features(items, features_fn, why, method)
        return distances(cur, np.stack(beh), self.spec.dist_function, self.spec.p, _is_gaussian(items))

    def sample(self, n, rng, features_fn, reference):
        """Up to n distinct items (all of them when the buffer holds <= n)."""
        if n == 0 or self.size == 0:
            return []
        self.calls += 1
        s = self.spec
        items = {}
        if self.size <= n:
            chosen = rng.permutation(self.size)
        else:
            k = min(self.size, max(n, int(round(self.lam() * n))))
            cand = rng.choice(self.size, k, replace=False)
            if s.sample_strategy == "uniform" or k == n:
                chosen = cand
            else:
                why = "sample_strategy %s" % s.sample_strategy
                items = {int(c): self.item(int(c)) for c in cand}
                cand_items = [items[int(c)] for c in cand]
                if s.sample_strategy == "elite_sampling":
                    d = self._off_policy(cand_items, features_fn, why, "sample")
                else:
                    cur, _ = self._features(cand_items, features_fn, why, "sample")
                    ref = reference(features_fn)
                    if ref is None:  # no live batch: the newest stored unroll, as the platform does
                        ref_cur, _ = self._features([self.item(self.newest)], features_fn, why, "sample")
                        ref = ref_cur.mean(axis=(0, 1))
                    d = distances(cur, ref[None, None, :], s.dist_function, s.p, _is_gaussian(cand_items))
                picked = pick(d, self.counts[cand], n, s.elite_sampling_strategy)
                self.dist_picked, self.dist_candidates = float(d[picked].mean()), float(d.mean())
                chosen = cand[picked]
        self.counts[chosen] += 1
        self.drawn += len(chosen)
        return [items[int(c)] if int(c) in items else self.item(int(c)) for c in chosen]

    def stats(self):
        out = {"type": self.spec.type, "size": self.size, "capacity": self.spec.capacity,
               "nbytes": self.nbytes(), "drawn": self.drawn, "from_live": self.from_live,
               "added": self.added}
        if self.spec.sample_strategy != "uniform":
            out.update(lam=self.lam(), mean_dist_picked=self.dist_picked,
                       mean_dist_candidates=self.dist_candidates)
        return out

    _STATE = ("size", "pos", "newest", "added", "drawn", "from_live", "calls")

    def state(self, include_contents):
        st = {"drawn": self.drawn, "from_live": self.from_live, "calls": self.calls, "added": self.added}
        if include_contents:
            st.update({k: getattr(self, k) for k in self._STATE}, slots=list(self.slots),
                      counts=self.counts.copy(), slot_bytes=self.slot_bytes.copy())
        return st

    def load(self, st):
        for k in self._STATE:
            if k in st:
                setattr(self, k, st[k])
        if "slots" in st:
            self.slots = list(st["slots"])
            self.counts = np.array(st["counts"], np.int64)
            self.slot_bytes = np.array(st["slot_bytes"], np.int64)


# -------------------------------------------------------------------- mixer
def _apportion(targets, total):
    """Integer counts summing to total, close to targets (largest remainder; ties by order)."""
    base = np.maximum(np.floor(targets + 1e-9), 0).astype(np.int64)
    diff = int(total - base.sum())
    order = np.argsort(-(targets - base), kind="stable")
    if diff > 0:
        base[order[:diff]] += 1
    for j in order[::-1]:
        if diff >= 0:
            break
        if base[j] > 0:
            base[j] -= 1
            diff += 1
    return base


class ReplayMixer:
    """Builds each training batch from the queue (live unrolls) and the replay buffers.

    Per batch, source i contributes counts()[i] unrolls, sample_ratio_i x batch_size
    rounded deterministically; the rounding error is carried to the next batch, so
    over many batches the shares are exact (0.5/0.5 with batch_size 1 alternates).

    While a buffer holds fewer unrolls than its share (at the start of training),
    the shortfall comes from the live unrolls passed to sample() (counted as
    "from_live" in stats()). sample() raises ValueError when live_items cannot
    cover the queue's share plus that shortfall; passing all batch_size freshly
    dequeued unrolls always suffices.
    """

    def __init__(self, specs, batch_size, seed=0, total_updates=None):
        specs = list(specs)
        if not specs or not all(isinstance(s, ReplaySpec) for s in specs):
            raise ValueError("ReplayMixer needs a non-empty list of ReplaySpec (from parse_replay_parameters)")
        check_specs(specs)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError("ReplayMixer batch_size must be an integer >= 1, got %r" % (batch_size,))
        if total_updates is not None and total_updates <= 0:
            raise ValueError("ReplayMixer total_updates must be > 0 or None, got %r" % (total_updates,))
        self.specs, self.batch_size, self.total_updates = specs, int(batch_size), total_updates
        self.rng = np.random.default_rng(seed)
        self.sources = [_Queue(i, s) if s.type == "queue" else _Buffer(i, s, total_updates)
                        for i, s in enumerate(specs)]
        self.queue = next((q for q in self.sources if isinstance(q, _Queue)), None)
        self.buffers = [b for b in self.sources if isinstance(b, _Buffer)]
        self._ratios = np.array([s.sample_ratio for s in specs], np.float64)
        self._carry = np.zeros(len(specs), np.float64)
        self.last_fresh = []

    def counts(self):
        """Items per source (in spec order) for the next batch; sums to batch_size."""
        return _apportion(self._ratios * self.batch_size + self._carry, self.batch_size).tolist()

    def live_needed(self):
        """Fresh unrolls the next sample() should be given: the queue's share of the batch
        beyond what the queue carries over, plus what the buffers still filling up lack.
        Passing that many always satisfies sample()."""
        counts = self.counts()
        need = sum(max(0, counts[b.index] - len(b)) for b in self.buffers)
        if self.queue is not None:
            need += max(0, counts[self.queue.index] - len(self.queue.carry))
        return need

    def add(self, items, features_fn=None):
        """Copies every live unroll into every replay buffer (the queue only takes what sample() is given)."""
        for b in self.buffers:
            b.add(items, self.rng, features_fn)

    def sample(self, live_items, features_fn=None):
        """A training batch: a list of batch_size unrolls (queue share first, then each buffer's).

        features_fn(list of unrolls) -> list of [T, A] current-policy logits for
        their first T observations; needed only by custom prioritised sources.
        """
        counts = self.counts()
        live_items = list(live_items)
        pool = (self.queue.carry if self.queue else []) + live_items
        need = (counts[self.queue.index] if self.queue else 0) + sum(
            max(0, counts[b.index] - len(b)) for b in self.buffers)
        if len(pool) < need:
            raise ValueError(
                "ReplayMixer.sample got %d live unrolls (+%d carried by the queue) but this batch needs %d "
                "from live data (queue share plus what the replay buffers, still filling, lack); pass all "
                "%d freshly dequeued unrolls" % (len(live_items), len(pool) - len(live_items), need,
                                                 self.batch_size))
        self._carry += self._ratios * self.batch_size - np.array(counts)
        out, used, fresh = [], 0, []
        if self.queue:
            n = counts[self.queue.index]
            out += pool[:n]
            fresh += [True] * len(pool[:n])
            used = n
            self.queue.drawn += n
        ref_cache = {}

        def reference(fn):  # mean current-policy feature vector of the live batch, computed once
            if not live_items:
                return None
            if "ref" not in ref_cache:
                feats = [np.asarray(f, np.float64) for f in fn(live_items)]
                ref_cache["ref"] = np.concatenate([f.reshape(-1, f.shape[-1]) for f in feats]).mean(axis=0)
            return ref_cache["ref"]

        for b in self.buffers:
            n = counts[b.index]
            got = b.sample(n, self.rng, features_fn, reference)
            short = n - len(got)
            out += got + pool[used:used + short]
            fresh += [False] * len(got) + [True] * len(pool[used:used + short])
            used += short
            b.from_live += short
        self.last_fresh = fresh  # which of the batch's unrolls are new to training, not replayed
        if self.queue:  # keep the newest unused live unrolls, up to capacity
            cap = self.queue.spec.capacity
            keep = pool[used:][-cap:]
            old = {id(c) for c in self.queue.carry}
            self.queue.carry = [x if id(x) in old else _frozen_copy(x) for x in keep]
        return out

    def nbytes(self):
        return sum(s.nbytes() for s in self.sources)

    def stats(self):
        """{source name: {type, size, capacity, nbytes, drawn, ...}} plus "next_counts"."""
        out = {s.name: s.stats() for s in self.sources}
        out["next_counts"] = self.counts()
        return out

    def state_dict(self, include_contents=False):
        """Picklable state: RNG, rounding carry, per-source counters and lambda annealing.

        With include_contents the stored unrolls, their sample counts and the queue's
        carried unrolls come too (can be large: up to nbytes()). Without, a restored
        mixer starts with empty buffers but the same RNG stream and schedules; the
        per-unroll sample counts belong to the contents and are not kept.
        """
        return {"version": 1, "specs": [asdict(s) for s in self.specs], "batch_size": self.batch_size,
                "rng": self.rng.bit_generator.state, "carry": self._carry.copy(),
                "sources": [b.state(include_contents) if isinstance(b, _Buffer)
                            else dict({"drawn": b.drawn}, **({"carry": list(b.carry)} if include_contents else {}))
                            for b in self.sources]}

    def load_state_dict(self, state):
        specs = [asdict(s) for s in self.specs]
        if state.get("version") != 1 or state.get("specs") != specs or state.get("batch_size") != self.batch_size:
            raise ValueError(
                "replay state was saved for --replay_parameters %s with batch_size %s; this run has %s with "
                "batch_size %d -- use the same settings or start the replay afresh"
                % (json.dumps(state.get("specs")), state.get("batch_size"), json.dumps(specs), self.batch_size))
        self.rng.bit_generator.state = state["rng"]
        self._carry = np.array(state["carry"], np.float64)
        for src, st in zip(self.sources, state["sources"]):
            if isinstance(src, _Buffer):
                src.load(st)
            else:
                src.drawn = st["drawn"]
                if "carry" in st:
                    src.carry = list(st["carry"])
