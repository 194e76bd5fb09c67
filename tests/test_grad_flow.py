"""scripts/grad_flow.py: the first/last gradient ratios at initialisation, as measured.

The chapter's illustration has Post-Norm's ratio decaying with depth and Pre-Norm's near 1. With
this model's initialisation (embeddings of std 0.02, residual projections scaled by 1/sqrt(2L))
the measurement says otherwise, and these tests pin what it says (docs/ablation.md, gradient flow):
Pre-Norm's first block gets MORE gradient than its last, increasingly so with depth, because the
residual stream grows from the small embeddings and each block's norm divides its gradient by
the stream's scale; Post-Norm's stays just under 1 at every depth.
"""
import pytest

from scripts.grad_flow import grad_flow_rows, main

# d 128 with 8 heads of 16, a short context and a small vocabulary: the study's behaviour (docs/ablation.md,
# "Gradient flow at initialisation") at a size a test can afford
SMALL = ["model.d_model=128", "model.n_heads=8", "model.context_length=32", "data.vocab_size=256"]


@pytest.fixture(scope="module")
def rows():
    return {(r["norm_position"], r["n_layers"]): r for r in grad_flow_rows([2, 12], SMALL, batch_size=2, seed=0)}


def test_pre_norm_grows_with_depth_post_norm_stays_just_under_one(rows):
    pre2, pre12, post2, post12 = rows["pre", 2], rows["pre", 12], rows["post", 2], rows["post", 12]
    # Pre-Norm's ratio grows with depth (the stream grows through the residual sum); Post-Norm's unit-gain norm
    # at the end of every block holds its ratio just under 1 whatever the depth
    assert pre2["stream"] > 1.03
    assert pre12["stream"] > pre2["stream"] + 0.1
    assert pre12["params"] > pre2["params"] + 0.3
    for post in (post2, post12):
        assert 0.95 < post["stream"] < 1.0
        assert 0.9 < post["params"] < 1.05
    assert post12["stream"] == pytest.approx(post2["stream"], abs=0.02)  # no decay with depth


def test_pre_norm_ratio_follows_the_growth_of_the_residual_stream(rows):
    # Pre-Norm's stream grows from the small embeddings, and its first block's gradient is larger by about as
    # much: the norm that a block's input passes through divides the gradient by the stream's rms
    assert 1.05 < rows["pre", 2]["rms_growth"] < rows["pre", 12]["rms_growth"]
    for depth in (2, 12):
        assert rows["pre", depth]["stream"] == pytest.approx(rows["pre", depth]["rms_growth"], rel=0.15)
        # each Post-Norm block ends in a norm with unit gain: the stream's rms is 1 everywhere
        assert rows["post", depth]["rms_growth"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["--depths", "1", "4"], "--depths 1"),
    (["model.n_heads=7"], "model.n_heads=7"),
    (["model.no_such_key=1"], "no_such_key"),
])
def test_bad_settings_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err
