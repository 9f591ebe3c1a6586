"""
Sample from a trained model, as nanoGPT's sample.py: loads <out_dir>/ckpt.pt (any variant, saved from a
compiled model or not) and prints --num_samples continuations of --start, decoded with the run's tokenizer.
    python sample.py --out_dir=out --start="def " --num_samples=3 --max_new_tokens=200
--start is the text to continue, or FILE:path for the text of a UTF-8 file. Each token is drawn from the
softmax of the logits / --temperature over the --top_k most likely tokens (--top_k=None: all of them);
--top_k=1 is greedy decoding. The same --seed gives the same samples on the same machine.
stdout holds the samples only. Where it goes to a file or a pipe and stderr is a terminal, a count of the tokens
drawn shows on stderr, on one line, as it goes.
"""
from engine import starting  # first: a Ctrl-C from here to main's own handling is one line and exit code 130

import codecs
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

import configs
import data
from engine import files, flags, run_reader
from engine.run_folder import read_checkpoint
from engine.flags import UsageError, help_of
from model import GPT, GPTConfig


@dataclass
class SampleConfig:
    out_dir: str = help_of("the run folder whose ckpt.pt to load", default="out")
    start: str = help_of("the text to continue, or FILE:path", default="\n")
    num_samples: int = help_of("samples to print", default=3)
    max_new_tokens: int = help_of("tokens to add to --start in each sample", default=200)
    temperature: float = help_of("divides the logits: < 1 sharper, > 1 flatter", default=0.8)
    top_k: Optional[int] = help_of("sample from the k most likely tokens; None: all", default=200)
    seed: int = help_of("seeds torch's generators", default=1337)
    device: str = help_of("auto (cuda where there is a GPU), cpu, cuda or cuda:N", default="auto")


MIN_TEMPERATURE = 1e-3  # float32 logits up to ~3e35 stay finite when divided by it


def check(sc):
    """sc's values, or a UsageError saying which is wrong and what is allowed."""
    if sc.num_samples < 1 or sc.max_new_tokens < 1:
        raise UsageError(f"--num_samples={sc.num_samples} and --max_new_tokens={sc.max_new_tokens} must be >= 1")
    if sc.temperature < MIN_TEMPERATURE:
        # logits / temperature overflow to inf below this, and the softmax of infinities is NaN
        raise UsageError(f"--temperature={sc.temperature} must be >= {MIN_TEMPERATURE} (--top_k=1 samples greedily)")
    if sc.top_k is not None and sc.top_k < 1:
        raise UsageError(f"--top_k={sc.top_k} must be >= 1, or None to sample from the whole vocabulary")
    if sc.seed < 0:
        raise UsageError(f"--seed={sc.seed} must be in [0, 2^63), as train.py's")


def resolve_device(name):
    """--device as a device of this machine, as train.py resolves it (configs.resolve); sample.py runs on the CPU or
    a CUDA GPU."""
    try:
        kind = "auto" if name == "auto" else torch.device(name).type
    except RuntimeError:
        raise UsageError(f"--device={name} is not a device; use auto, cpu, cuda or cuda:N") from None
    if kind not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device={name} is not supported; use auto, cpu, cuda or cuda:N")
    return configs.resolve({"device": name}).device


def load_model(out_dir):
    """The model saved in out_dir/ckpt.pt and the name of its run's tokenizer."""
    path = run_reader.checkpoint_path(out_dir)
    if not os.path.isfile(path):
        raise UsageError(f"no checkpoint at {path}; train one with python train.py --out_dir={out_dir}")
    checkpoint = read_checkpoint(path)  # torch.load(weights_only=True): a checkpoint runs no code
    try:
        model = GPT(GPTConfig(**checkpoint["model_config"]))
        # a compiled model's state_dict prefixes every name with _orig_mod.
        model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()})
        tokenizer = checkpoint["train_config"]["tokenizer"]
        broken = [name for name, value in model.state_dict().items()
                  if value.is_floating_point() and not torch.isfinite(value).all()]
    except (TypeError, ValueError, KeyError, RuntimeError, AttributeError) as e:
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{path} does not hold a model this model.py can build ({cause})") from None
    if broken:
        raise UsageError(f"{path} holds non-finite weights ({broken[0]}{' and others' if broken[1:] else ''}); sample "
                         "from a checkpoint of a run that had not diverged")
    return model, tokenizer


def start_text(start):
    """--start's text: itself, or the text of the UTF-8 file FILE:path names."""
    if start.startswith("FILE:"):
        path = start.removeprefix("FILE:")
        problem = files.not_a_file(path)
        if problem:  # a FIFO or a device would block the read, or never end
            raise UsageError(f"--start=FILE:{path} is {problem}; give a regular UTF-8 text file")
        try:
            with open(path, "rb") as f:
                start = f.read().decode("utf-8")
        except OSError as e:
            raise UsageError(f"--start=FILE:{path}: cannot read it ({e.strerror})") from None
        except UnicodeDecodeError:
            raise UsageError(f"--start=FILE:{path} is not UTF-8 text; convert it, e.g. iconv -t utf-8") from None
    try:
        start.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes of a command line arrive as lone surrogates
        raise UsageError("--start is not valid UTF-8 text; give UTF-8 text or FILE:path of a UTF-8 file") from None
    if not start:
        raise UsageError("--start is empty; give at least one character to continue (the default is a newline)")
    return start


def main(argv):
    starting.done()  # Ctrl-C is KeyboardInterrupt from here on
    if flags.wants_help(argv):
        flags.print_help(__doc__, SampleConfig)
        return 0
    try:
        sc = flags.build(SampleConfig, flags.parse(argv, SampleConfig))
        check(sc)
        device = resolve_device(sc.device)
        start = start_text(sc.start)
        model, tokenizer = load_model(sc.out_dir)
        enc = data.get_tokenizer(tokenizer)
        if model.config.vocab_size < enc.n_vocab:
            raise UsageError(f"the checkpoint's vocab_size={model.config.vocab_size} is smaller than its "
                             f"tokenizer's ({tokenizer}, {enc.n_vocab}); it is not a checkpoint train.py wrote")
    except (UsageError, data.DataError) as e:
        return flags.fail("sample.py", e)
    model.to(device)
    idx = torch.tensor(data.encode(enc, start).astype("int64"), device=device)[None]
    torch.manual_seed(sc.seed)  # every device's generator
    # on a terminal the samples show as they are drawn; sent to a file or a pipe, the count shows the work going on
    counter = Counter(sc, shown=sys.stderr.isatty() and not sys.stdout.isatty())
    try:
        for sample in range(sc.num_samples):
            stream(model, enc, idx, sc, counter, sample)
            print("---------------", flush=True)
    except KeyboardInterrupt:
        print(flush=True)  # ends the sample's line
        counter.end(done=False)
        print("sample.py: stopped by Ctrl-C", file=sys.stderr)
        return 130
    counter.end()
    return 0


def stream(model, enc, idx, sc, counter, sample):
    """One sample, printed as it is drawn: --start, then each token's text as soon as it completes a character
    (an incremental UTF-8 decoder, so the whole prints as data.decode prints it)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    print(decoder.decode(data.token_bytes(enc, idx[0].tolist())), end="", flush=True)
    for drawn in range(1, sc.max_new_tokens + 1):
        idx = model.generate(idx, 1, temperature=sc.temperature, top_k=sc.top_k)
        print(decoder.decode(data.token_bytes(enc, idx[0, -1:].tolist())), end="", flush=True)
        counter.show(sample, drawn)
    print(decoder.decode(b"", final=True), flush=True)


class Counter:
    """The tokens drawn so far, on one line of stderr that each token rewrites (a carriage return), where shown."""

    def __init__(self, sc, shown):
        self.samples, self.tokens, self.shown = sc.num_samples, sc.max_new_tokens, shown
        self.started, self.width = time.perf_counter(), 0

    def show(self, sample, drawn):
        if self.shown:
            self.say(f"sample {sample + 1} of {self.samples}: {drawn} of {self.tokens} tokens", end="")

    def end(self, done=True):
        """Ends the line: with the samples' count and time where they are done, as it stands where stopped."""
        if not (self.shown and self.width):
            return
        if done:
            self.say(f"{self.samples} sample{'s' if self.samples > 1 else ''} of {self.tokens} tokens in "
                     f"{time.perf_counter() - self.started:.1f} s", end="\n")
        else:
            print(file=sys.stderr, flush=True)
        self.width = 0

    def say(self, text, end):
        line = f"sample.py: {text}"
        print(f"\r{line:<{self.width}}", end=end, file=sys.stderr, flush=True)  # padded over a longer line
        self.width = max(self.width, len(line))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
