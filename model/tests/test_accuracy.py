"""Integer model against the float model: the accuracy target, measured on fresh seeds.

Every run draws a fresh (param_seed, eval_seed) pair (os.urandom) and prints it,
so a failure names its pair; ``MOEKDA_SEED=P:E`` reproduces one.  The reference
pair (0, 1) and the pairs with param seeds 1-3 were used to tune the formats; a
drawn pair was not (the pairs that set the bounds below are 300-499 / 500-699, the
fresh pairs of docs/numerics.md section 5 are 100-111 / 200-211).  Fast: tiny over 256 tokens, one pair.  Slow: tiny and small,
8 consecutive pairs each.

The bounds are what the measurement supports, not the target.  Over 200 fresh
pairs per config (param seeds 300-499, eval seeds 500-699, 256 tokens: `moekda
accuracy -c <cfg> --param-seed 300 --eval-seed 500 --pairs 200`) the routing-matched
output misses cosine 0.99 at 1-4 tokens of 28/200 (tiny) and 13/200 (small) pairs,
worst 0.9446 / 0.9444 (docs/numerics.md section 5), so "0.99 at every token" is not
asserted per pair.  The per-token minimum is heavy-tailed (one of 100 further random
tiny pairs reached 0.895: token 1, whose KDA read o is 28x below typical and comes
out of the integer model pointing elsewhere, o cosine -0.05; section 6), so it gets a
loose bound, against
gross breakage; the tight bounds are on the means and on the number of tokens below
0.99, which are not heavy-tailed.  Every bound sits beyond the worst of those pairs
(the worst measured value is given with each).  Routing flips are bounded
separately: a flip is a near-tie of the float scores, not an arithmetic error.
"""
import os

import numpy as np
import pytest

from moekda.config import load_config
from model.accuracy import evaluate

N_TOKENS = 256

# each comment: the worst of the 200 measured pairs, tiny / small
FLIP_RATE_MAX = {"tiny": 0.08, "small": 0.14}   # routing flips per token: 12/256 = 0.047 / 23/256 = 0.090
Y_MATCHED_MIN = 0.80         # 0.9446 / 0.9444 (0.895 in a further 100 tiny pairs); heavy-tailed
Y_MATCHED_MEAN = 0.998       # 0.99906 / 0.99887
Y_MATCHED_BELOW = 6          # tokens < 0.99 per 256: 4 / 1
Y_MEAN = 0.975               # plain y, flips included: 0.99108 / 0.98554
H_MIN = 0.80                 # 0.9408 / 0.9694 (0.9195 in the further 100); heavy-tailed
H_MEAN = 0.999               # 0.99960 / 0.99964
H_BELOW = 4                  # 2 / 1
S_BELOW = 3                  # 1 / 1 (S min is 0 at a token whose float state is ~1e-4 of typical:
                             # beta ~ 0 at the first token, the integer state rounds to exactly 0)
KDA_OUT_MEAN = 0.98          # 0.98991 / 0.99317
MOE_MATCHED_MEAN = 0.994     # 0.99613 / 0.99727
# A flipped token's gap: c_k - min(c[I]), c = the float model's choice values (sigmoid
# score + bias, in score units, scores in (0, 1)), c_k its k-th largest, I the integer
# model's experts (model.accuracy.flip_gaps): 0 iff the integer set is a valid float
# top-k.  For scale: the float top-k margin c_k - c_(k+1) has median 0.19 (tiny) and
# 0.084 (small) over all tokens.  Measured over the 2692 flipped tokens of the 400 pairs:
# gap median 0.006, 90th percentile 0.023, 99th 0.047, max 0.123.  Two causes:
# * the router's own int8 arithmetic (int8 hn and W_r, 8-bit logit code): at tokens where
#   its input h is accurate (h cosine >= NEAR_TIE_H_COS there: 2624 of the 2692 flips)
#   the gap is at most 0.050 (tiny) / 0.059 (small); 0.089 in a further 100 random tiny
#   pairs (logit errors +0.21 and -0.25, 3-4 LSB of the logit code, at h cosine 0.9995).
#   These flips are the near-ties, asserted below FLIP_GAP_MAX (the worst seen, 0.089,
#   with margin);
# * an error in h itself (the KDA branch's, section 6 of docs/numerics.md): the router
#   then sees another input, and the gap grows with the h error (0.32 at a token with h
#   cosine 0.967, in a further 100 random tiny pairs).  Not a tie, and not bounded here
#   per flip: the h bounds above cover it.
# The pooled distribution of all flips of many pairs (slow test) is bounded as well.
NEAR_TIE_H_COS = 0.999
FLIP_GAP_MAX = 0.15
FLIP_GAP_MEDIAN_MAX = 0.02     # measured 0.0065 / 0.0063
FLIP_GAP_P90_MAX = 0.08        # measured 0.023 / 0.024


def seed_pair(rng_bytes=os.urandom):
    """A fresh (param_seed, eval_seed), or MOEKDA_SEED=P:E.  Seeds from 10**4 up: clear of
    the tuned pairs and of the calibration sequences' token seeds (1000..1003)."""
    env = os.environ.get("MOEKDA_SEED")
    if env:
        p, e = (int(v) for v in env.split(":"))
    else:
        p, e = (10_000 + int.from_bytes(rng_bytes(4), "little") % (2**31 - 10_000) for _ in range(2))
    return p, e


def check(name, p, e):
    label = f"{name} MOEKDA_SEED={p}:{e}"
    print(f"accuracy seed pair: {label}")
    res = evaluate(load_config(name), n_tokens=N_TOKENS, param_seed=p, eval_seed=e)
    s = res["summary"]
    summary = {t: (round(s[t]["cos_min"], 4), round(s[t]["cos_mean"], 5), s[t]["tokens_below_0.99"])
               for t in ("y", "y_matched", "h", "kda_out", "moe_out_matched", "S")}
    print(f"  (cos min, cos mean, tokens < 0.99): {summary}; flips {s['routing_flips']}, "
          f"max flip gap {s['flip_gap_max']:.4f}")
    assert s["y_matched"]["cos_min"] >= Y_MATCHED_MIN, label
    assert s["y_matched"]["cos_mean"] >= Y_MATCHED_MEAN, label
    assert s["y_matched"]["tokens_below_0.99"] <= Y_MATCHED_BELOW, label
    assert s["y"]["cos_mean"] >= Y_MEAN, label
    assert s["h"]["cos_min"] >= H_MIN, label             # KDA residual: no routing involved
    assert s["h"]["cos_mean"] >= H_MEAN, label
    assert s["h"]["tokens_below_0.99"] <= H_BELOW, label
    assert s["S"]["tokens_below_0.99"] <= S_BELOW, label  # the 16-bit state tracks the float state
    assert s["kda_out"]["cos_mean"] >= KDA_OUT_MEAN, label
    assert s["moe_out_matched"]["cos_mean"] >= MOE_MATCHED_MEAN, label
    assert s["routing_flips"] <= FLIP_RATE_MAX[name] * N_TOKENS, label
    # every flip where the router's input is accurate is a near-tie: the integer model's
    # experts are a float top-k up to a small gap
    flips, gaps = res["flips"], res["flip_gap"]
    accurate_h = res["per_token"]["h"]["cos"] >= NEAR_TIE_H_COS
    assert np.all(gaps[~flips] == 0), label              # same set: no gap
    assert np.all(gaps[flips] > 0), label                 # another set: a positive gap...
    near = flips & accurate_h
    assert np.all(gaps[near] <= FLIP_GAP_MAX), \
        f"{label}: flips at tokens {np.nonzero(near)[0]} with an accurate h, gaps {np.round(gaps[near], 4)}"
    return gaps[flips]


def test_seed_pair_reproducible_from_env(monkeypatch):
    monkeypatch.setenv("MOEKDA_SEED", "123:456")
    assert seed_pair() == (123, 456)
    monkeypatch.delenv("MOEKDA_SEED")
    p, e = seed_pair(lambda n: b"\x01\x00\x00\x00")
    assert p == e == 10_001


def test_tiny_fresh_pair():
    check("tiny", *seed_pair())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "small"])
def test_256_tokens_fresh_pairs(name):
    """8 fresh pairs (from MOEKDA_SEED=P:E: P+i, E+i): every bound on each, and the pooled
    flips' gaps (about 30 for tiny, 75 for small) are near-ties as a distribution."""
    p, e = seed_pair()
    gaps = np.concatenate([check(name, p + i, e + i) for i in range(8)])
    print(f"{name}: {gaps.size} flips, gap median {np.median(gaps):.4f}, 90th percentile {np.percentile(gaps, 90):.4f}")
    assert gaps.size >= 10, f"{name} MOEKDA_SEED={p}:{e}: {gaps.size} flips"
    assert np.median(gaps) <= FLIP_GAP_MEDIAN_MAX, f"{name} MOEKDA_SEED={p}:{e}"
    assert np.percentile(gaps, 90) <= FLIP_GAP_P90_MAX, f"{name} MOEKDA_SEED={p}:{e}"


def test_accuracy_command_writes_reports(tmp_path, capsys):
    from cli import main
    assert main(["accuracy", "-c", "tiny", "-n", "32", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "accuracy.json").is_file() and (tmp_path / "accuracy.md").is_file()
    assert "y_matched" in capsys.readouterr().out


def test_accuracy_command_pairs_table(tmp_path, capsys):
    from cli import main
    assert main(["accuracy", "-c", "tiny", "-n", "32", "--param-seed", "7", "--eval-seed", "8",
                 "--pairs", "2", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny | 7 | 8 |" in out and "| tiny | 8 | 9 |" in out and "Over the 2 pairs" in out
    assert (tmp_path / "accuracy_pairs.json").is_file() and (tmp_path / "accuracy_pairs.md").is_file()


def test_accuracy_command_rejects_bad_length(capsys):
    from cli import main
    assert main(["accuracy", "-c", "tiny", "-n", "0"]) == 2
    assert "--tokens = 0: allowed range" in capsys.readouterr().err


def test_accuracy_command_points_a_latent_moe_model_to_the_model_tool(capsys):
    """A LatentMoE config (model-tiny-hybrid) is not a layer the table is built for: one line
    naming the field and the tool that evaluates it, exit 2 (it was a traceback)."""
    from cli import main
    assert main(["accuracy", "-c", "model-tiny-hybrid", "-n", "8"]) == 2
    err = capsys.readouterr().err
    assert "model.moe_latent" in err and "model.model_accuracy" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
