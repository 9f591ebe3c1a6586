"""sample.py on tiny real runs: decoded text that continues --start, seeded, from compiled and plain checkpoints,
greedy decoding checked against an argmax loop written out, the run's own tokenizer, and bad input."""

import os
import pickle
import subprocess
import sys

import pytest
import torch

import data
import model
import sample
from conftest import ROOT, run_train, save_checkpoint, tiny

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = tiny(n_layer=1, eval_iters=1, log_interval=10, warmup_iters=None, lr=None, max_iters=20, eval_interval=10)


def trained_run(corpus, folder, *flags):
    """A tiny run's out_dir, trained by train.main in this process."""
    code = run_train(corpus, folder / "data", folder / "out", *TINY, *flags)
    assert code == 0
    return folder / "out"


@pytest.fixture(scope="module")
def out_dir(corpus, tmp_path_factory):
    return trained_run(corpus, tmp_path_factory.mktemp("run"))


def samples(capsys, out, *flags):
    """sample.main's samples (the text between the separators); asserts it exits 0 and prints no errors."""
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--device=cpu", *flags]) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and printed.out.endswith("\n---------------\n")
    return printed.out.split("\n---------------\n")[:-1]


def greedy_by_hand(model, idx, steps):
    """Greedy decoding written out: the argmax of the last position's logits, on at most block_size tokens."""
    model.eval()
    with torch.no_grad():
        for _ in range(steps):
            logits, _ = model(idx[:, -model.config.block_size:])
            idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx


@pytest.mark.slow
def test_samples_continue_start_and_the_seed_fixes_them(out_dir, capsys):
    first = samples(capsys, out_dir, "--start=norm layer", "--num_samples=3", "--max_new_tokens=30", "--seed=1")
    assert len(first) == 3 and len(set(first)) == 3
    for text in first:
        # byte tokens: 30 new bytes decode to 1-30 characters (a byte that is not UTF-8 is one U+FFFD)
        assert text.startswith("norm layer") and 10 < len(text) <= 40
    assert samples(capsys, out_dir, "--start=norm layer", "--num_samples=3", "--max_new_tokens=30", "--seed=1") == first
    other = samples(capsys, out_dir, "--start=norm layer", "--num_samples=3", "--max_new_tokens=30", "--seed=2")
    assert other != first


def test_start_from_a_file(out_dir, capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("gamma beta\nscale ", encoding="utf-8")
    (text,) = samples(capsys, out_dir, f"--start=FILE:{prompt}", "--num_samples=1", "--max_new_tokens=5")
    assert text.startswith("gamma beta\nscale ")


@pytest.mark.slow
def test_top_k_1_is_greedy_decoding_past_block_size(out_dir, capsys):
    """40 new tokens after 10 with block_size 32: the context is cropped from the 23rd new token on."""
    model, tokenizer = sample.load_model(str(out_dir))
    enc = data.get_tokenizer(tokenizer)
    idx = torch.tensor(data.encode(enc, "norm layer").astype("int64"))[None]
    expected = greedy_by_hand(model, idx, 40)
    torch.manual_seed(0)
    assert torch.equal(model.generate(idx, 40, top_k=1), expected)
    (text,) = samples(capsys, out_dir, "--start=norm layer", "--num_samples=1", "--max_new_tokens=40", "--top_k=1")
    assert text == data.decode(enc, expected[0].tolist())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own import
def test_a_compiled_models_checkpoint_loads(out_dir, capsys, tmp_path):
    """torch.compile wraps the model: its state_dict names every weight _orig_mod.<name> (nanoGPT issue #325)."""
    checkpoint = torch.load(out_dir / "ckpt.pt", weights_only=True)
    model, _ = sample.load_model(str(out_dir))
    compiled = torch.compile(model).state_dict()  # names only: nothing is compiled until it is called
    assert all(k.startswith("_orig_mod.") for k in compiled)
    (tmp_path / "compiled").mkdir()
    save_checkpoint({**checkpoint, "model": compiled}, tmp_path / "compiled" / "ckpt.pt")
    flags = ["--start=head", "--num_samples=2", "--max_new_tokens=20", "--seed=5"]
    assert samples(capsys, tmp_path / "compiled", *flags) == samples(capsys, out_dir, *flags)


@pytest.mark.slow
def test_batch_statistic_norms_and_gpt2_tokens_sample_with_the_runs_tokenizer(corpus, tmp_path, capsys, small_bpe):
    """A PowerNorm run with sinusoidal positions and a BPE tokenizer (a small one standing in for GPT-2's: 301 tokens,
    vocab padded to 320): greedy samples are the argmax loop's tokens decoded with that BPE, which the byte tokenizer
    would not give."""
    out = trained_run(corpus, tmp_path, "--norm=powernorm", "--pn_warmup=5", "--pos=sinusoidal", "--tokenizer=gpt2",
                      "--max_iters=10", "--eval_interval=10")
    model, tokenizer = sample.load_model(str(out))
    assert tokenizer == "gpt2" and model.config.vocab_size == 320
    enc = data.get_tokenizer("gpt2")
    idx = torch.tensor(data.encode(enc, "norm layer").astype("int64"))[None]
    expected = data.decode(enc, greedy_by_hand(model, idx, 12)[0].tolist())
    (text,) = samples(capsys, out, "--start=norm layer", "--num_samples=1", "--max_new_tokens=12", "--top_k=1")
    assert text == expected and text.startswith("norm layer")


def test_ids_past_the_tokenizer_decode_to_replacement_characters(small_bpe):
    """train.py pads a BPE's tokens to a multiple of 64 (GPT-2's 50257 to 50304, the small BPE's 301 to 320); the
    extra ids are no text."""
    enc = data.get_tokenizer("gpt2")
    ids = data.encode(enc, "norm layer").tolist()
    assert data.decode(enc, ids + [300, 319, 301] + ids) == "norm layer<|endoftext|>\ufffd\ufffdnorm layer"
    assert data.decode(data.get_tokenizer("byte"), [110, 0xE2, 0x98, 0x83, 0xE2, 110]) == "n\u2603\ufffdn"


def write(folder, content):
    folder.mkdir(exist_ok=True)
    if isinstance(content, bytes):
        (folder / "ckpt.pt").write_bytes(content)
    else:
        save_checkpoint(content, folder / "ckpt.pt")


BAD_FLAGS = [
    (["--temperature=0"], "--temperature=0.0 must be >= 0.001"),
    (["--top_k=0"], "--top_k=0 must be >= 1"),
    (["--seed=-1"], "--seed=-1 must be in [0, 2^63), as train.py's"),
    (["--num_samples=0"], "--num_samples=0"),
    (["--max_new_tokens=-1"], "--max_new_tokens=-1"),
    (["--max_new_tokens=many"], "--max_new_tokens=many"),
    (["--device=tpu"], "--device=tpu"),
    (["--start="], "--start is empty"),
    (["--start=norm\udcff"], "--start is not valid UTF-8"),
    (["--start=FILE:/no/such/prompt.txt"], "cannot read it"),
    (["--temprature=0.5"], "--temprature"),
    (["--temperature=1e-300"], "--temperature=1e-300 must be >= 0.001"),
    (["--seed=9223372036854775808"], "--seed=9223372036854775808 is too large"),
    (["--start=FILE:/dev/zero"], "--start=FILE:/dev/zero is not a regular file"),
]


@pytest.mark.parametrize("flags, expected", BAD_FLAGS, ids=lambda v: v[0] if isinstance(v, list) else "")
def test_bad_flags_are_one_line_and_exit_code_2(out_dir, capsys, flags, expected):
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", *flags]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("\n") == 1
    assert printed.err.startswith("sample.py: ") and expected in printed.err


def test_a_start_file_that_is_not_utf8(out_dir, capsys, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", f"--start=FILE:{tmp_path / 'latin1.txt'}"]) == 2
    assert capsys.readouterr().err.startswith(f"sample.py: --start=FILE:{tmp_path / 'latin1.txt'} is not UTF-8")


def edited(**changes):
    """A change to a real checkpoint: {key: new value}, or {key: function of the old value}."""
    return lambda checkpoint: {**checkpoint, **{k: v(checkpoint[k]) if callable(v) else v for k, v in changes.items()}}


@pytest.mark.parametrize("content, expected", [
    (None, "no checkpoint at"),
    (b"PK\x03\x04 half a zip file", "it is damaged or not a checkpoint"),
    ({"model": {}}, "is not a nanonorm checkpoint"),
    (torch.zeros(3), "is not a nanonorm checkpoint"),
    (edited(model={}), "can build (Error(s) in loading state_dict"),
    (edited(model_config=lambda c: {**c, "n_layers": 1}), "can build (GPTConfig.__init__() got an unexpected"),
    (edited(model_config=lambda c: {**c, "n_layer": 0}), "can build (--n_layer=0 must be a positive integer)"),
    (edited(train_config={}), "can build ('tokenizer')"),
    (edited(step=-5), "is not a nanonorm checkpoint (step is -5, not an integer >= 0)"),
    (edited(best_val="x"), "is not a nanonorm checkpoint (best_val is 'x', not a number)"),
    (edited(model=lambda m: {**m, "lm_head.weight": m["lm_head.weight"] * float("nan")}),
     "holds non-finite weights ("),
    # a pickle torch did not write: torch's warning of its protocol was two more lines
    (pickle.dumps({"a": os.system}), "it is damaged or not a checkpoint"),
], ids=["missing", "damaged", "no config", "a tensor", "no weights", "unknown field", "bad field", "no tokenizer",
        "a negative step", "best_val as text", "NaN weights", "a foreign pickle"])
def test_bad_checkpoints_are_one_line_and_exit_code_2(out_dir, capsys, tmp_path, recwarn, content, expected):
    if content is None:
        (tmp_path / "out").mkdir()
    elif callable(content):
        write(tmp_path / "out", content(torch.load(out_dir / "ckpt.pt", weights_only=True)))
    else:
        write(tmp_path / "out", content)
    assert sample.main([f"--out_dir={tmp_path / 'out'}", "--device=cpu"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("\n") == 1
    assert printed.err.startswith("sample.py: ") and expected in printed.err
    assert not recwarn.list, [str(w.message) for w in recwarn]  # a warning is more lines on stderr


def test_a_model_smaller_than_its_tokenizer_is_refused(out_dir, capsys, tmp_path, small_bpe):
    """A byte-level model said to be a BPE's: the BPE's token ids would run past its embedding table."""
    write(tmp_path / "out", edited(train_config=lambda c: {**c, "tokenizer": "gpt2"})(
        torch.load(out_dir / "ckpt.pt", weights_only=True)))
    assert sample.main([f"--out_dir={tmp_path / 'out'}", "--device=cpu"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("\n") == 1
    assert "vocab_size=256 is smaller than its tokenizer's (gpt2, 301)" in printed.err


@pytest.mark.slow
def test_a_truncated_checkpoint_from_the_shell_prints_no_traceback(out_dir, tmp_path):
    """Half of a real checkpoint, and a --start of bytes that are not UTF-8, as a shell passes them."""
    write(tmp_path / "out", (out_dir / "ckpt.pt").read_bytes()[:5000])
    for flags, expected in [([f"--out_dir={tmp_path / 'out'}"], "it is damaged or not a checkpoint"),
                            ([f"--out_dir={out_dir}", b"--start=\xff\xfe"], "--start is not valid UTF-8")]:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), *flags], capture_output=True,
                                cwd=ROOT)
        assert result.returncode == 2 and result.stdout == b""
        (line,) = result.stderr.decode().splitlines()
        assert line.startswith("sample.py: ") and expected in line


@pytest.mark.slow
def test_a_fifo_as_start_file_is_refused_unread(out_dir, tmp_path):
    os.mkfifo(tmp_path / "prompt")
    done = subprocess.run([sys.executable, "sample.py", f"--out_dir={out_dir}", f"--start=FILE:{tmp_path / 'prompt'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # a regression hangs: timeout
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a regular file" in done.stderr


def test_tokens_show_as_they_are_drawn_and_ctrl_c_is_one_line(out_dir, capsys, monkeypatch):
    printed, generate = [], model.GPT.generate

    def watched(self, idx, steps, **kwargs):
        printed.append(capsys.readouterr().out)
        if len(printed) == 4:
            raise KeyboardInterrupt
        return generate(self, idx, steps, **kwargs)

    monkeypatch.setattr(model.GPT, "generate", watched)
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--start=norm", "--max_new_tokens=9"]) == 130
    assert printed[0] == "norm" and len("".join(printed[1:])) >= 1  # the start, then each token before the next
    assert capsys.readouterr().err == "sample.py: stopped by Ctrl-C\n"


def read_terminal(master):
    """All a pseudo-terminal's program wrote to it, its newlines as written (the terminal turns each into \\r\\n)."""
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the program has closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")
def test_samples_sent_to_a_pipe_show_a_count_of_tokens_on_the_terminal(out_dir):
    master, terminal = os.openpty()
    result = subprocess.run([sys.executable, "sample.py", f"--out_dir={out_dir}", "--device=cpu", "--start=norm",
                             "--num_samples=2", "--max_new_tokens=3"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=terminal, timeout=120)
    os.close(terminal)
    shown = read_terminal(master)
    assert result.returncode == 0
    stdout = result.stdout.decode()
    assert stdout.count("\n---------------\n") == 2 and "sample.py" not in stdout  # the samples only
    *counts, last = shown.split("\r")[1:]
    assert [count.rstrip() for count in counts] == [
        f"sample.py: sample {sample} of 2: {drawn} of 3 tokens" for sample in (1, 2) for drawn in (1, 2, 3)]
    assert last.startswith("sample.py: 2 samples of 3 tokens in ") and last.rstrip().endswith(" s")
    assert last.endswith("\n") and last.count("\n") == 1


def test_samples_on_a_terminal_are_their_own_progress(out_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert len(samples(capsys, out_dir, "--num_samples=2", "--max_new_tokens=3")) == 2  # and nothing on stderr
