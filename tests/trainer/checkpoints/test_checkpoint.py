"""Checkpoints: atomic folders with a manifest, keep_last, exact trainer-state round trip."""
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.checkpoints import io as checkpoint
from trainer.models.tiny import build_tokenizer


def small_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def state(step, ref_step=0):
    return checkpoint.TrainerState(step=step, stage=0, data_cursor=7 * step, ref_step=ref_step, spec_sha256="x")


def test_keep_last_prunes_folders_archives_and_leftovers(tmp_path):
    model, tok = small_model(), build_tokenizer()
    opt = torch.optim.AdamW(model.parameters())
    root = checkpoint.checkpoints_dir(tmp_path)
    root.mkdir(parents=True)
    (root / ".tmp-step-00000009-dead").mkdir()                  # a crash mid-save
    for step in (1, 2, 3):
        saved = checkpoint.save(tmp_path, state(step), model, tok, opt, None, keep_last=2)
        (root / (saved.path.name + ".tar.gz")).write_bytes(b"cached archive")
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step-00000002", "step-00000002.tar.gz", "step-00000003", "step-00000003.tar.gz"]
    assert checkpoint.latest(tmp_path).name == "step-00000003"


def test_state_round_trip_and_reference(tmp_path):
    model, ref, tok = small_model(0), small_model(1), build_tokenizer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    saved = checkpoint.save(tmp_path, state(5, ref_step=2), model, tok, opt, ref, keep_last=3)
    assert (saved.path / "trainer_state" / "ref.safetensors").is_file()
    expected_draw = torch.rand(3)  # RNG state was saved before this draw

    model2, ref2 = small_model(3), small_model(4)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    st = checkpoint.load_state(saved.path, opt2, ref2)
    assert (st.step, st.data_cursor, st.ref_step) == (5, 35, 2)
    assert torch.equal(torch.rand(3), expected_draw)
    for a, b in zip(ref.state_dict().values(), ref2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
    reloaded = Qwen2ForCausalLM.from_pretrained(saved.path)
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()):
        assert torch.equal(a, b)
