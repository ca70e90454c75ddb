"""Golden parity of kiln's LLaMA with Hugging Face transformers (the independent reference).

A random small LlamaForCausalLM (GQA 4:2, llama3 RoPE scaling whose three frequency bands are all
exercised, tied and untied embeddings) is built in transformers on CPU and saved; kiln (through
the kiln-hf program) loads it, and logits, loss and every parameter gradient are compared. kiln
then trains a few steps and saves, transformers loads that directory, and logits are compared
again. Round trips kiln -> HF -> kiln and HF -> kiln -> HF must be bit-exact. bf16 is held to
the design rule: kiln's bf16 error against the fp32 reference at most twice transformers' own
bf16 error against it (plus a small floor).
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ = 96, 2, 40


def hf_config(tied: bool):
    # head_dim 8, theta 10000: wavelengths 6.3, 63, 628, 6283 against the llama3 band edges
    # 64/4 = 16 and 64/1 = 64: one kept, one blended, two scaled.
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        tie_word_embeddings=tied, initializer_range=0.2, bos_token_id=1, eos_token_id=2)


def load_hf(path, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()


def hf_forward(model, batch, grads=False):
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grads):
        out = model(input_ids=batch["input_ids"], labels=batch["labels"])
    if grads:
        out.loss.backward()
    return out


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def hf_dir(request, tmp_path_factory):
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM(hf_config(request.param))
    with torch.no_grad():  # norm weights away from 1, so a missed or misplaced norm weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100  # ignored targets (a prompt), so the mean must count only the rest
    path = tmp_path_factory.mktemp("batch") / "batch.safetensors"
    save_file({"input_ids": ids, "labels": labels}, str(path))
    return path, {"input_ids": ids, "labels": labels}


def kiln_forward(run_kiln, model_dir, batch_path, out_path, *extra):
    res = run_kiln("kiln-hf", "forward", "--model", model_dir, "--batch", batch_path, "--out", out_path, *extra)
    assert res.returncode == 0, res.stderr
    return load_file(str(out_path))


def test_hf_to_kiln_logits_loss_and_gradients(run_kiln, hf_dir, batch_file, tmp_path):
    batch_path, batch = batch_file
    hf = load_hf(hf_dir)
    ref = hf_forward(hf, batch, grads=True)
    got = kiln_forward(run_kiln, hf_dir, batch_path, tmp_path / "out.safetensors", "--grads")

    assert got["logits"].shape == ref.logits.shape
    assert max_diff(got["logits"], ref.logits) <= 1e-4
    assert abs(got["loss"].item() - ref.loss.item()) <= 1e-5
    hf_grads = {name: p.grad for name, p in hf.named_parameters()}
    kiln_grads = {k[len("grad."):]: v for k, v in got.items() if k.startswith("grad.")}
    assert set(kiln_grads) == set(hf_grads)  # tied: one embedding gradient carrying both uses
    for name, g in hf_grads.items():
        scale = g.abs().max().item()
        assert max_diff(kiln_grads[name], g) <= 1e-5 * max(scale, 1.0), name


def test_kiln_trains_then_transformers_loads(run_kiln, hf_dir, batch_file, tmp_path):
    batch_path, batch = batch_file
    trained = tmp_path / "trained"
    res = run_kiln("kiln-hf", "train", "--model", hf_dir, "--batch", batch_path, "--out", trained, "--steps", "4",
                   "--lr", "3e-3")
    assert res.returncode == 0, res.stderr
    losses = [float(line.split()[-1]) for line in res.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 4 and losses[-1] < losses[0]

    hf = load_hf(trained)
    before = load_hf(hf_dir)
    changed = [n for n, p in hf.named_parameters() if not torch.equal(p, dict(before.named_parameters())[n])]
    assert len(changed) == len(list(hf.parameters()))  # every parameter was trained and saved
    ref = hf_forward(hf, batch)
    got = kiln_forward(run_kiln, trained, batch_path, tmp_path / "out.safetensors")
    assert max_diff(got["logits"], ref.logits) <= 1e-4
    assert abs(got["loss"].item() - ref.loss.item()) <= 1e-5


def read_dir_tensors(path):
    index = path / "model.safetensors.index.json"
    if index.exists():
        tensors = {}
        for shard in set(json.loads(index.read_text())["weight_map"].values()):
            tensors.update(load_file(str(path / shard)))
        return tensors
    return load_file(str(path / "model.safetensors"))


def assert_bit_exact(a, b):
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_hf_to_kiln_to_hf_is_bit_exact(run_kiln, hf_dir, tmp_path):
    # kiln writes shards here, so transformers' sharded loading of kiln output is covered too.
    res = run_kiln("kiln-hf", "convert", "--model", hf_dir, "--out", tmp_path / "k", "--max-shard-bytes", "20000")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "k" / "model.safetensors.index.json").exists()
    assert_bit_exact(read_dir_tensors(tmp_path / "k"), read_dir_tensors(hf_dir))
    hf = load_hf(tmp_path / "k")
    original = load_hf(hf_dir)
    assert hf.config.rope_parameters == original.config.rope_parameters
    for key in ("num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings", "vocab_size"):
        assert getattr(hf.config, key) == getattr(original.config, key), key
    assert_bit_exact(dict(hf.state_dict()), dict(original.state_dict()))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_kiln_to_hf_to_kiln_is_bit_exact(run_kiln, tmp_path, dtype):
    yaml = tmp_path / "model.yaml"
    yaml.write_text("vocab_size: 64\nhidden_size: 32\nintermediate_size: 48\nnum_hidden_layers: 2\n"
                    "num_attention_heads: 4\nnum_key_value_heads: 1\nrms_norm_eps: 1.0e-5\nrope_theta: 500000\n"
                    "tie_word_embeddings: true\nrope_scaling:\n  rope_type: llama3\n  factor: 32\n"
                    "  original_max_position_embeddings: 128\n")
    res = run_kiln("kiln-hf", "init", "--model", yaml, "--out", tmp_path / "k0", "--seed", "3", "--dtype", dtype)
    assert res.returncode == 0, res.stderr
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    hf = load_hf(tmp_path / "k0", dtype="auto")  # the dtype recorded in config.json
    assert hf.dtype == torch_dtype
    assert hf.config.rope_parameters["factor"] == 32 and hf.config.rope_parameters["rope_theta"] == 500000
    hf.save_pretrained(tmp_path / "h1")
    res = run_kiln("kiln-hf", "convert", "--model", tmp_path / "h1", "--out", tmp_path / "k2")
    assert res.returncode == 0, res.stderr
    assert_bit_exact(read_dir_tensors(tmp_path / "k2"), read_dir_tensors(tmp_path / "k0"))
    # Same config, except that transformers spells out the derived head_dim (32 / 4) kiln left unset.
    expected = dict(json.loads((tmp_path / "k0" / "config.json").read_text()), head_dim=8)
    assert json.loads((tmp_path / "k2" / "config.json").read_text()) == expected


def test_bf16_parity_within_twice_the_reference_error(run_kiln, hf_dir, batch_file, tmp_path):
    batch_path, batch = batch_file
    ref32 = hf_forward(load_hf(hf_dir), batch)
    ref16 = hf_forward(load_hf(hf_dir, torch.bfloat16), batch)
    got = kiln_forward(run_kiln, hf_dir, batch_path, tmp_path / "out.safetensors", "--dtype", "bf16")
    assert got["logits"].dtype == torch.bfloat16
    hf_err = max_diff(ref16.logits, ref32.logits)
    kiln_err = max_diff(got["logits"], ref32.logits)
    assert hf_err > 0  # the reference really ran in bf16
    assert kiln_err <= 2 * hf_err + 1e-3, (kiln_err, hf_err)
    # The loss is the fp32 cross-entropy of those bf16 logits (formula below), so its error is
    # bounded through the logits: cross-entropy moves at most 2x the largest logit change.
    logits = got["logits"].float()[:, :-1].reshape(-1, VOCAB)
    targets = batch["labels"][:, 1:].reshape(-1)
    expected = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    assert abs(got["loss"].item() - expected.item()) <= 1e-5
    assert abs(got["loss"].item() - ref32.loss.item()) <= 2 * (2 * hf_err + 1e-3)
    print(f"bf16 logits: kiln err {kiln_err:.4g}, transformers err {hf_err:.4g}")

def test_bf16_autocast_gradients_of_both_linear_paths_are_as_close_to_fp32(run_kiln, hf_dir, batch_file, tmp_path):
    # The trainer's mixed precision (fp32 weights, bf16 autocast, fused loss): kiln's CPU projections
    # (fp32 GEMMs over bf16-rounded operands where the CPU has no AMX) against autocast's own
    # at::linear (kernels linear=aten), both measured against transformers' fp32 gradients.
    batch_path, batch = batch_file
    hf = load_hf(hf_dir)
    hf_forward(hf, batch, grads=True)
    hf_grads = {name: p.grad for name, p in hf.named_parameters()}

    def worst(*extra):
        got = kiln_forward(run_kiln, hf_dir, batch_path, tmp_path / "g.safetensors", "--grads", "--fused-loss",
                           "--autocast", "bf16", *extra)
        return max(max_diff(got["grad." + n], g) / g.abs().max().item() for n, g in hf_grads.items())

    kiln_err, aten_err = worst(), worst("--kernels", "kiln,linear=aten")
    assert aten_err > 0  # bf16 really ran
    assert kiln_err <= 2 * aten_err, (kiln_err, aten_err)
    print(f"bf16 gradients vs fp32: kiln linear {kiln_err:.4g}, autocast at::linear {aten_err:.4g}")
    bad = run_kiln("kiln-hf", "forward", "--model", hf_dir, "--batch", batch_path, "--out", tmp_path / "x.safetensors",
                   "--kernels", "kiln,matmul=aten")
    assert bad.returncode != 0 and "unknown op 'matmul'" in bad.stderr, bad.stderr


def test_mismatched_checkpoints_are_reported_by_name(run_kiln, hf_dir, batch_file, tmp_path):
    batch_path, _ = batch_file
    tensors = read_dir_tensors(hf_dir)
    config = (hf_dir / "config.json").read_text()

    def write(name, tensors, config_text=config):
        d = tmp_path / name
        d.mkdir()
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(config_text)
        return d

    def error(d):
        res = run_kiln("kiln-hf", "forward", "--model", d, "--batch", batch_path, "--out", tmp_path / "o.safetensors")
        assert res.returncode == 2 and "Traceback" not in res.stderr
        return res.stderr

    missing = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    assert "missing tensors: model.layers.1.mlp.up_proj.weight" in error(write("missing", missing))
    extra = dict(tensors, **{"model.layers.2.mlp.up_proj.weight": torch.zeros(3)})
    assert "model does not have: model.layers.2.mlp.up_proj.weight" in error(write("extra", extra))
    wrong = dict(tensors, **{"model.norm.weight": torch.ones(31)})
    msg = error(write("shape", wrong))
    assert "'model.norm.weight'" in msg and "[31]" in msg and "[32]" in msg
    bad_config = json.loads(config)
    bad_config["hidden_act"] = "gelu"
    msg = error(write("act", tensors, json.dumps(bad_config)))
    assert "config.json" in msg and "'hidden_act'" in msg and "gelu" in msg
