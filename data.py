"""
Corpora and tokenizers: text -> token ids in uint16/uint32 memmaps, and random batches from them.

prepare() writes <data_dir>/<name>-<tokenizer>-<content>/ with train.bin, val.bin (the first 90% and the last 10%
of the tokens) and meta.json; get_batch() samples (x, y) from them. The folder is keyed on the corpus's text (its
sha256, which meta.json records), so an edited corpus is prepared anew. As a script it prepares one corpus:
    python data.py --dataset=builtin --tokenizer=byte
Datasets: builtin (the running Python's standard library source, no download), shakespeare (tiny
Shakespeare, downloaded once), a path to a text file or a folder of text files, or hf:NAME[:CONFIG[:SPLIT]], a corpus
of the `datasets` library streamed and tokenized by --workers processes (engine/corpus.py): a Hub name or a local
file or folder of parquet, JSON-lines or text files, whose folder is keyed on the name, config and split (a local
corpus's on its files' paths, sizes and times) and resumes where it stopped:
    python data.py --dataset=hf:HuggingFaceFW/fineweb-edu:sample-10BT:train --tokenizer=gpt2 --workers=16
Tokenizers: byte (every byte is a token, vocab 256) and gpt2 (GPT-2 BPE, vocab 50257).
"""

from engine import starting  # first: a Ctrl-C from here to main's own handling is one line and exit code 130

import fcntl
import functools
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import sysconfig
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from engine import corpus
from engine import signals
from engine.files import (LOCK, NotAFile, WriteError, cannot_write, not_a_file, not_own_file, open_own, read_json,
                          read_own, write_and_sync, write_atomic)
from engine.flags import UsageError, build, fail, help_of, parse, print_help, wants_help

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# tiny Shakespeare is 1.1 MB: a --url that sends more is not it (file:///dev/zero would fill the memory)
MAX_DOWNLOAD = 64 * 2**20
TOKENIZERS = ("byte", "gpt2")
VOCAB_SIZES = {"byte": 256, "gpt2": 50257}  # what get_tokenizer's encodings have (n_vocab): test_data checks it
# A preparation writes into <folder>.<pid>.tmp, where <folder> is <name>-<tokenizer>-<12 hex digits>, and puts MARKER
# in it first: a leftover is removed only where both say that nanonorm made it (a user's notes.2023.tmp is not).
TMP_NAME = re.compile(rf"(.+-(?:{'|'.join(TOKENIZERS)})-[0-9a-f]{{12}})\.([0-9]+)\.tmp")
MARKER = "preparing.nanonorm"
MARKER_TEXT = b"nanonorm's data.py prepares this folder; a preparation removes it once its process is gone\n"


# --dataset=hf:NAME[:CONFIG[:SPLIT]]: a corpus of the datasets library, streamed (engine/corpus.py)
STREAMED = "hf:"
FINEWEB_EDU = "hf:HuggingFaceFW/fineweb-edu:sample-10BT:train"  # 9.7M documents, about 10B GPT-2 tokens
STREAM_FORMAT = 1  # what else a streamed folder's bytes depend on: raised whenever encode_documents changes them
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
MAX_WORKERS = 1024


class DataError(Exception):
    """A problem with the data that a person can fix; the message is one line saying what and how."""


# GPT-2's BPE ranks, the one file tiktoken's r50k_base encoding downloads (tiktoken_ext/openai_public.py)
GPT2_RANKS_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
GPT2_RANKS_SIZE = "0.8 MB"  # 835,554 bytes
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # tiktoken checks the same


def tiktoken_cache_file(url):
    """Where tiktoken keeps a file it downloads (tiktoken/load.py, read_file_cached): in TIKTOKEN_CACHE_DIR, else
    DATA_GYM_CACHE_DIR, else <temp>/data-gym-cache, named by the SHA-1 of its URL; None where caching is off (an
    empty TIKTOKEN_CACHE_DIR)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if folder is None:
        folder = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.join(folder, hashlib.sha1(url.encode()).hexdigest()) if folder else None


def load_gpt2():
    """GPT-2's BPE: tiktoken's r50k_base (GPT-2's ranks, split pattern and <|endoftext|> = 50256, stored as one
    .tiktoken file; the "gpt2" name needs two other files). tiktoken downloads the ranks on first use and caches
    them: that first use says so in one line on stderr."""
    cache = tiktoken_cache_file(GPT2_RANKS_URL)
    cached = cache is not None and os.path.exists(cache)
    damaged = cached and not gpt2_ranks_in(cache)  # judged first: tiktoken removes a damaged copy to fetch it again
    try:
        enc = tiktoken.get_encoding("r50k_base")
    except Exception as e:
        raise DataError(gpt2_failure(cache, cached, damaged, type(e).__name__)) from e
    if not cached:
        where = f"cached in {os.path.dirname(cache)}" if cache else "not cached: TIKTOKEN_CACHE_DIR is empty"
        print(f"downloaded GPT-2's BPE ranks (r50k_base, {GPT2_RANKS_SIZE}) once; {where}", file=sys.stderr)
    return enc


def gpt2_ranks_in(path):
    """Whether path holds GPT-2's ranks (their sha256, as tiktoken checks them); a file it cannot read, too."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == GPT2_RANKS_SHA256
    except OSError:
        return True  # not to be judged here: tiktoken's own read says what is wrong with it


def gpt2_failure(cache, cached, damaged, error):
    """The one line of a gpt2 tokenizer that did not load (error: the exception's name), with what to do about the
    cache it had: a damaged copy in it (tiktoken removes it, where it can, and downloads the ranks again), none in
    the folder TIKTOKEN_CACHE_DIR names, or none where tiktoken looks by default."""
    failed = f"could not load the gpt2 tokenizer ({error})"
    if damaged:
        gone = not os.path.exists(cache)
        what = (f"{cache}, tiktoken's cached copy of GPT-2's ranks, was damaged (not their sha256)" +
                (f", and tiktoken removed it to download them ({GPT2_RANKS_SIZE}) again" if gone else ""))
        return (f"{failed}: {what}; put a good copy at {cache}, or run once with the network (docs/scale.md: "
                "GPT-2's BPE)")
    if cached:
        return f"{failed}, with GPT-2's ranks cached in {cache}"
    fetch = f"{failed}, whose ranks ({GPT2_RANKS_SIZE}) it downloads once"
    variable = next((name for name in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR") if name in os.environ), None)
    if cache and variable:  # tiktoken's order: the first of the two that is set
        return (f"{fetch}; {variable}={os.environ[variable]} holds no copy of them ({cache}): offline, put them "
                "there (docs/scale.md: GPT-2's BPE)")
    off = " (an empty TIKTOKEN_CACHE_DIR turns tiktoken's cache off)" if cache is None else ""
    return (f"{fetch}; offline, set TIKTOKEN_CACHE_DIR to a folder holding GPT-2's cached ranks{off} (tiktoken's "
            "cache; docs/scale.md: GPT-2's BPE)")


def get_tokenizer(name):
    if name == "byte":
        # 256 single-byte ranks and no merges: each UTF-8 byte is its own token and its id is the byte
        return tiktoken.Encoding(name="byte", pat_str=r50k_pat_str, special_tokens={},
                                 mergeable_ranks={bytes([i]): i for i in range(256)})
    if name == "gpt2":
        return load_gpt2()
    raise DataError(f"--tokenizer={name} is not a tokenizer; choose one of {', '.join(TOKENIZERS)}")


def token_dtype(vocab_size):
    # ids run from 0 to vocab_size - 1; uint16 holds up to 65535
    return np.uint16 if vocab_size <= 65536 else np.uint32


def skipped(name):
    # installed packages are not the stdlib, and tests are mostly fixtures and asserts
    return name in ("site-packages", "dist-packages", "test", "tests", "idle_test") or name.startswith("test_")


def read_text(path):
    # bytes, then decode: text mode would turn \r\n into \n and the tokens would not decode to the file
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def utf8_text(raw):
    """raw (bytes) as text if it is UTF-8 text (decodes strictly, holds no NUL byte), else None: a binary or
    latin-1 file would otherwise train the model on replacement characters."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def wide_encoding(head):
    """"utf-32" or "utf-16" where a file's first bytes are text in it (a byte-order mark, or the NUL bytes with which
    it stores ASCII: three of every four, or one of every two), else None."""

    def mostly_nul(part):
        return len(part) >= 2 and part.count(0) > 0.9 * len(part)

    if head[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff") or mostly_nul(head[1::4] + head[2::4]):
        return "utf-32"
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or mostly_nul(head[0::2]) or mostly_nul(head[1::2]):
        return "utf-16"
    return None


def is_binary(raw):
    """Whether bytes that are not UTF-8 text are a binary file's (NUL bytes that no UTF-16 or UTF-32 text explains):
    an image or a compiled file in a dataset folder, which read_corpus skips rather than refuses."""
    return 0 in raw and wide_encoding(raw[:4096]) is None


def not_utf8(raw):
    """What a file's bytes that are not UTF-8 text are, where, and what to do (one phrase): UTF-32 or UTF-16 text,
    binary (a NUL byte), a UTF-8 file cut short in its last character, a UTF-8 file with stray bytes (more UTF-8
    characters than bytes that are not: converting it from latin-1 would turn each of its "é" into "Ã©"), or text in
    a one-byte encoding such as latin-1. Offsets count bytes from 0."""
    encoding = wide_encoding(raw[:4096])
    if encoding:
        return f"it is {encoding.upper()} text; convert it to UTF-8, e.g. iconv -f {encoding} -t utf-8"
    if 0 in raw:
        return f"it holds a NUL byte at byte {raw.index(0)}: a binary file, not text; give a text file"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        first = e
    if first.end == len(raw) and first.reason == "unexpected end of data":
        cut = len(raw) - first.start
        return (f"its last character, from byte {first.start}, is cut off: a UTF-8 file cut short; drop its last "
                f"{'byte' if cut == 1 else f'{cut} bytes'} (head -c {first.start}) or restore its end")
    text = raw.decode("utf-8", errors="surrogateescape")  # each byte that is not UTF-8 becomes one U+DC80-U+DCFF
    stray = len(re.findall("[\udc80-\udcff]", text))
    utf8 = len(re.findall("[\u0080-\ud7ff\ue000-\U0010ffff]", text))
    where = f"byte {first.start} (0x{raw[first.start]:02x}) is not UTF-8" + (
        f", nor {'is' if stray == 2 else 'are'} {stray - 1} more byte{'s' * (stray > 2)}" if stray > 1 else "")
    if utf8 >= stray:
        return (f"{where}, in a file of {utf8} UTF-8 characters beyond ASCII: stray bytes, not another encoding "
                "(iconv -f latin1 would turn each \"é\" into \"Ã©\"); fix or remove them (iconv -c -f utf-8 -t utf-8 "
                "drops them)")
    return f"{where}: text in a one-byte encoding such as latin-1; convert it to UTF-8, e.g. iconv -f latin1 -t utf-8"


def builtin_files():
    """The stdlib's own *.py files, without installed packages and tests: (root, sorted relative paths)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not skipped(d)]  # in place: os.walk does not descend into them
        rel = Path(dirpath).relative_to(root)
        files += [(rel / f).as_posix() for f in filenames if f.endswith(".py") and not skipped(f)]
    return root, sorted(files)


def folder_files(root):
    """The files under root in sorted path order; hidden files and folders (names starting with '.') are skipped,
    and so are symlinks to folders (rglob does not follow them: a link to a parent would loop). A symlink to a file
    is a DataError: links in a dataset folder are not followed (one to a file of the folder would read it twice)."""
    found = [path for path in sorted(root.rglob("*"))
             if path.is_file() and not any(p.startswith(".") for p in path.relative_to(root).parts)]
    for path in found:
        if path.is_symlink():
            raise DataError(f"--dataset={root}: {path} is a symlink to {os.readlink(path)}, and links in a dataset "
                            "folder are not followed; copy the file into the folder, or remove the link")
    return found


def download(url, path):
    """url's text into path, unless path exists; the URL goes beside it (path.url), and a path downloaded from
    another URL is refused (a file put there by hand has no .url, and serves any URL). A failed download, an empty
    one or one that is not UTF-8 text (a binary file, an error page in another encoding) is refused and leaves
    nothing behind, so it is never reused."""
    source = Path(f"{path}.url")
    if path.exists():
        cached = source.read_text(errors="replace").strip() if source.exists() else url
        if cached != url:
            raise DataError(f"--url={url}: {path} was downloaded from {cached}; give that --url, or delete {path} "
                            "to download this one")
        return
    local = urllib.parse.urlparse(url)
    problem = not_a_file(urllib.request.url2pathname(local.path)) if local.scheme == "file" else None
    if problem:  # a FIFO would block the open forever
        raise DataError(f"--url={url} is {problem}; give a URL of tiny Shakespeare's input.txt")
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            raw = r.read(MAX_DOWNLOAD + 1)
    except (OSError, ValueError) as e:
        raise DataError(f"could not download {url} ({getattr(e, 'reason', e)}); without network, put tiny "
                        f"Shakespeare's input.txt at {path} by hand and run again") from e
    if len(raw) > MAX_DOWNLOAD:
        raise DataError(f"{url} sent more than {MAX_DOWNLOAD // 2**20} MB, which tiny Shakespeare's 1.1 MB is not; "
                        f"give a --url that serves its input.txt, or put that file at {path} by hand")
    text = utf8_text(raw)
    if text is None or not text.strip():
        what = "nothing" if not raw.strip() else "something that is not UTF-8 text (binary data, or another encoding)"
        raise DataError(f"{url} sent {what}; give a --url that serves tiny Shakespeare's input.txt, or put that file "
                        f"at {path} by hand")
    path.parent.mkdir(parents=True, exist_ok=True)  # after the download: a failed one leaves nothing behind
    write_atomic(source, url.encode())  # first: a text without its .url would pass for one put there by hand
    write_atomic(path, raw)


def resolved(dataset):
    """The absolute path of --dataset, or a DataError for a path through a symlink loop."""
    try:
        return Path(dataset).resolve()
    except (OSError, RuntimeError):  # Python < 3.13 raises RuntimeError on a loop
        raise DataError(f"--dataset={dataset} leads through a symlink loop; give a path to a text file or a folder of "
                        "text files") from None


def corpus_name(dataset):
    if dataset in ("builtin", "shakespeare"):
        return dataset
    path = resolved(dataset)
    # the hash keeps two different paths with the same basename apart
    return f"{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def corpus_files(dataset, data_dir, url):
    """(files, source): the paths of the corpus's files in the order their texts are joined, and where they are.
    shakespeare is downloaded once, into data_dir."""
    if dataset == "builtin":
        root, files = builtin_files()
        return [root / f for f in files], dict(dataset="builtin", path=str(root), python=platform.python_version())
    if dataset == "shakespeare":
        path = Path(os.path.abspath(data_dir)) / "shakespeare" / "input.txt"
        download(url or SHAKESPEARE_URL, path)
        return [path], dict(dataset="shakespeare", path=str(path), url=url or SHAKESPEARE_URL)
    path = resolved(dataset)
    if not path.exists():
        raise DataError(f"--dataset={dataset}: no such file or folder; use builtin, shakespeare, "
                        "or a path to a text file or a folder of text files")
    if path.is_file():
        return [path], dict(dataset=dataset, path=str(path))
    found = folder_files(path)
    refuse_nanonorms_own(dataset, path, found)
    return found, dict(dataset=dataset, path=str(path))


def refuse_nanonorms_own(dataset, root, found):
    """A DataError where the folder --dataset names is, or holds, nanonorm's own output rather than a corpus: a run's
    folder (its run.lock, or config.json beside log.jsonl), which would train on its config and log and skip its
    checkpoints, or prepared data (meta.json beside train.bin)."""
    names = {(path.parent, path.name) for path in found}
    for folder, name in sorted(names):
        if name == LOCK or (name == "log.jsonl" and (folder, "config.json") in names):
            what = "a nanonorm run's folder (config.json, log.jsonl, checkpoints)"
        elif name == "meta.json" and (folder, "train.bin") in names:
            what = "data nanonorm prepared (train.bin, val.bin, meta.json)"
        else:
            continue
        where = "is" if folder == root else f"holds {folder}, which is"
        raise DataError(f"--dataset={dataset} {where} {what}, not a corpus; give a text file or a folder of text "
                        "files")


def read_corpus(dataset, files, source):
    """(text, source, skipped): the corpus as one string, source with the number of files read, and the files left
    out. builtin's files are read as they are. Every other file must be UTF-8 text, or is refused naming it and what
    it is (not_utf8), with one exception: in a folder, a binary file (an image, a compiled file: is_binary) is
    skipped, and counted in source's "skipped". A text file in another encoding is refused even in a folder:
    skipped, its text would be left out of the corpus without a word."""
    if dataset == "builtin":
        return "\n".join(read_text(f) for f in files), {**source, "files": len(files)}, []
    texts, skipped = [], []
    for path in files:
        raw = path.read_bytes()
        text = utf8_text(raw)
        if text is not None:
            texts.append(text)
        elif Path(source["path"]).is_dir() and is_binary(raw):
            skipped.append(path)
        else:
            raise DataError(f"--dataset={dataset}: {path} is not UTF-8 text ({not_utf8(raw)})")
    source = {**source, "files": len(texts), **({"skipped": len(skipped)} if skipped else {})}
    return "\n".join(texts), source, skipped


def say_skipped(dataset, skipped):
    """The note of the binary files a folder's preparation left out (read_corpus), the first three named."""
    if skipped:
        named = ", ".join(str(path) for path in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
        print(f"note: --dataset={dataset}: {len(skipped)} binary file{'s' * (len(skipped) > 1)} skipped (NUL bytes, "
              f"not text): {named}", file=sys.stderr)


def stamp(files):
    """A hash of the files' paths, sizes and modification times: a corpus whose stamp is in a prepared folder's
    meta.json was prepared there and is not read again. Any change to a file changes it (and a touch that changes
    nothing makes prepare read the corpus, hash its text and find the same folder)."""
    digest = hashlib.sha256()
    for path in files:
        info = path.stat()
        digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def unigram_entropy(ids, vocab_size):
    """Entropy in nats/token of the empirical unigram distribution: the loss of the best model that
    ignores context, so a model must get below it to have learned anything from context."""
    return corpus.entropy(np.bincount(ids, minlength=vocab_size))


def encode(enc, text):
    """The token ids of text as a numpy array."""
    if enc.name == "byte":
        # the byte tokenizer has no merges, so its ids are the UTF-8 bytes: numpy reads them in milliseconds,
        # where tiktoken's per-piece loop takes seconds on the 12 MB builtin corpus
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    # encode_ordinary: "<|endoftext|>" in a source file is plain text, not a special token
    return np.array(enc.encode_ordinary(text))


def decode(enc, ids):
    """The text of token ids. An id past the tokenizer's vocabulary (train.py pads the model's vocab to a multiple
    of 64) decodes to U+FFFD, as a byte sequence that is not UTF-8 does."""
    return token_bytes(enc, ids).decode("utf-8", errors="replace")


def token_bytes(enc, ids):
    """The bytes of token ids; an id past the tokenizer's vocabulary is the bytes of U+FFFD."""
    return b"".join(enc.decode_single_token_bytes(i) if i < enc.n_vocab else "\ufffd".encode() for i in ids)


def write_prepared(folder, enc, text, source, tokenizer):
    """train.bin, val.bin and meta.json, written into a temporary folder that is then renamed to folder: a
    prepared folder is complete or absent, whatever stops the preparation (a full disk, Ctrl-C)."""
    dtype = token_dtype(enc.n_vocab)
    ids = encode(enc, text).astype(dtype)
    n_train = len(ids) * 9 // 10  # integer arithmetic: no float rounding in the split
    train, val = ids[:n_train], ids[n_train:]
    meta = dict(tokenizer=tokenizer, vocab_size=enc.n_vocab, dtype=np.dtype(dtype).name,
                train_tokens=len(train), val_tokens=len(val), source=source,
                unigram_entropy=unigram_entropy(val, enc.n_vocab))
    tmp = Path(f"{folder}.{os.getpid()}.tmp")
    try:
        tmp.mkdir()
        # MARKER first: what says that the folder is nanonorm's to remove, should this process be killed
        contents = ((MARKER, MARKER_TEXT), ("train.bin", train), ("val.bin", val),
                    ("meta.json", json.dumps(meta, indent=2).encode()))
        for name, content in contents:
            try:
                write_and_sync(tmp / name, content)
            except OSError as e:
                raise cannot_write(folder / name, e) from None
        if folder.exists():
            shutil.rmtree(folder)  # a preparation stopped before it was whole (no meta.json)
        os.remove(tmp / MARKER)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def locked(lock_path):
    """Whether some process holds the flock on lock_path (one that does not exist is held by none)."""
    try:
        fd = open_own(lock_path, os.O_RDONLY)
    except (OSError, NotAFile):  # a link or a FIFO in its place: nothing can hold it (prepare refuses it)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_leftovers(data_dir, held):
    """The temporary folders (<folder>.<pid>.tmp) that preparations left when their process was killed (SIGKILL, a
    power cut): removed when that process is gone and nobody holds the folder's lock (held: the folder whose lock
    this process holds), so a preparation on another machine sharing data_dir keeps its own. Only a folder that is
    nanonorm's by its name (TMP_NAME) and by the MARKER inside it is removed: never a user's folder or a link."""
    for tmp in Path(data_dir).glob("*.tmp"):
        match = TMP_NAME.fullmatch(tmp.name)
        if not match or tmp.is_symlink() or not tmp.is_dir() or not marked(tmp) or signals.alive(int(match[2])):
            continue
        folder = tmp.parent / match[1]
        if folder == held or not locked(f"{folder}.lock"):
            shutil.rmtree(tmp, ignore_errors=True)


def marked(tmp):
    """Whether the folder tmp holds MARKER, as a regular file that says what write_prepared writes there."""
    try:
        return read_own(tmp / MARKER) == MARKER_TEXT
    except (OSError, NotAFile):
        return False


def prepared_with(data_dir, prefix, files_stamp):
    """The prepared folder <data_dir>/<prefix><content> whose meta.json records this stamp, or None. Only a name
    that ends in the content's 12 hex digits: a preparation's <folder>.<pid>.tmp holds a whole meta.json just
    before it is renamed, and a process that took it would find it gone."""
    for meta_path in sorted(Path(data_dir).glob(glob.escape(prefix) + "[0-9a-f]" * 12 + "/meta.json")):
        try:
            if read_json(meta_path)["source"]["stamp"] == files_stamp:
                return meta_path.parent
        except (OSError, ValueError, KeyError, TypeError, NotAFile):
            continue  # a damaged folder: load_meta names it if it is the one asked for
    return None


def prepare(dataset="builtin", tokenizer="byte", data_dir="data", url=None, workers=None):
    """Tokenizes the corpus into <data_dir>/<name>-<tokenizer>-<sha256 of its text>/ and returns the folder after
    checking it (load_meta). A corpus already prepared, with the same text, is not prepared again; an edited one is
    prepared into a new folder, and runs on the old one keep theirs. Every process may call it at once: one process
    per data_dir (per disk) tokenizes while the others wait on a file lock, then all find the same folder. A corpus
    of the datasets library (hf:...) is streamed by prepare_streamed, `workers` processes tokenizing it."""
    if url is not None and dataset != "shakespeare":
        raise DataError(f"--url only applies to --dataset=shakespeare, not --dataset={dataset}")
    if url is not None and not url.strip():
        raise DataError("--url is empty; give where to download tiny Shakespeare from, or leave --url out for "
                        "its usual address")
    if not dataset.strip():
        raise DataError("--dataset is empty (it would read the current folder); use builtin, shakespeare, "
                        "or a path to a text file or a folder of text files")
    if not str(data_dir).strip():
        raise DataError("--data_dir is empty (it would prepare into the current folder); give a folder for the "
                        "prepared data, such as data")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise DataError(f"--workers={workers} must be from 1 to {MAX_WORKERS}")
    enc = get_tokenizer(tokenizer)  # before reading the corpus, so a bad name fails at once
    if is_streamed(dataset):
        folder = prepare_streamed(dataset, enc, tokenizer, data_dir, workers or len(os.sched_getaffinity(0)))
        load_meta(folder)
        return str(folder)
    prefix = f"{corpus_name(dataset)}-{tokenizer}-"
    try:
        files, source = corpus_files(dataset, data_dir, url)
        source["stamp"] = stamp(files)
        folder = prepared_with(data_dir, prefix, source["stamp"])
        if folder is None:
            # read and checked before the lock: a bad corpus writes nothing, not even the lock file
            text, source, skipped = read_corpus(dataset, files, source)
            if not text.strip():
                raise DataError(f"--dataset={dataset} holds no text ({source['path']}: UTF-8 text files read: "
                                f"{source['files']}, binary files skipped: {len(skipped)}); give a non-empty UTF-8 "
                                "text file or a folder holding some")
            say_skipped(dataset, skipped)
            source["sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
            folder = Path(data_dir) / (prefix + source["sha256"][:12])
            folder.parent.mkdir(parents=True, exist_ok=True)
            # flock, not a marker file: the kernel releases it when its holder exits, even on kill -9. The lock
            # file stays: removing it would let a third process lock a new file while the first holds the old one
            with open(f"{folder}.lock", "w", opener=open_own) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                remove_leftovers(data_dir, held=folder)
                if not (folder / "meta.json").exists():  # another process may have prepared it while this one waited
                    write_prepared(folder, enc, text, source, tokenizer)
    except OSError as e:
        raise cannot_access(e, data_dir) from e
    load_meta(folder)
    return str(folder)


def cannot_access(error, data_dir):
    return DataError(f"cannot read or write {error.filename or data_dir} ({error.strerror}); --dataset must be "
                     f"readable and --data_dir={data_dir} a folder you can write to")


def is_streamed(dataset):
    """Whether --dataset names a corpus of the datasets library (hf:...)."""
    return dataset.startswith(STREAMED)


def streamed_spec(dataset):
    """(name, config, split) of --dataset=hf:NAME[:CONFIG[:SPLIT]]: config None where left out or empty, split
    "train" where left out (a local corpus has that one split)."""
    parts = dataset[len(STREAMED):].split(":")
    if len(parts) > 3 or not parts[0].strip() or (len(parts) == 3 and not parts[2].strip()):
        raise DataError(f"--dataset={dataset} is not a corpus of the datasets library; write hf:NAME[:CONFIG[:SPLIT]]"
                        f" (e.g. {FINEWEB_EDU}), or hf:PATH for a local file or folder of parquet, JSON-lines or "
                        "text files")
    name, config, split = (parts + ["", ""])[:3]
    return name, config or None, split or "train"


def spec_text(name, config, split):
    """--dataset=hf:NAME[:CONFIG[:SPLIT]] of these parts, the defaults left out."""
    tail = [config or "", split] if split != "train" else [config] if config else []
    return ":".join([STREAMED + name, *tail])


def absolute_streamed(dataset):
    """--dataset=hf:... as a run records it: a local corpus's path made absolute, a Hub name as it is (and a spec
    prepare refuses, as it is)."""
    try:
        name, config, split = streamed_spec(dataset)
    except DataError:
        return dataset
    return spec_text(os.path.abspath(name), config, split) if os.path.exists(name) else dataset


def streamed_identity(dataset, tokenizer):
    """(folder name, identity, local files or None) of a corpus of the datasets library. The identity is what its
    prepared bytes depend on: a Hub corpus's name, config and split (a folder prepared elsewhere is found here
    without the network; the revision it was prepared from is in its meta.json), a local corpus's path, split and
    files' stamp (an edited file makes a new folder), and the tokenizer and the split rule."""
    name, config, split = streamed_spec(dataset)
    path = resolved(name)
    if path.exists():
        files = [path] if path.is_file() else folder_files(path)
        if not files:
            raise DataError(f"--dataset={dataset}: {path} holds no files; give parquet, JSON-lines or text files")
        identity = dict(path=str(path), split=split, stamp=stamp(files))
        label = corpus_name(str(path))
    elif HUB_NAME.fullmatch(name):
        files, identity = None, dict(name=name, config=config, split=split)
        label = "-".join(part for part in (name.replace("/", "--"), config, split) if part)
    else:
        raise DataError(f"--dataset={dataset}: {name} is neither a file or folder here nor a Hub name (OWNER/NAME); "
                        f"give a local path or a Hub dataset, e.g. {FINEWEB_EDU}")
    identity.update(tokenizer=tokenizer, format=STREAM_FORMAT, val_every=corpus.VAL_EVERY)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"hf-{re.sub(r'[^A-Za-z0-9_.=-]+', '-', label)}-{tokenizer}-{digest}", identity, files


def prepared_streamed(dataset, tokenizer, data_dir):
    """The prepared folder of a corpus of the datasets library, or None where it is not prepared in data_dir
    (sweep.py refuses to start runs that would prepare billions of tokens each)."""
    folder = Path(data_dir) / streamed_identity(dataset, tokenizer)[0]
    return folder if (folder / "meta.json").exists() else None


def prepare_streamed(dataset, enc, tokenizer, data_dir, workers):
    """The prepared folder of a corpus of the datasets library, streamed into it by engine/corpus.py where it is
    not there yet, or resumed where a preparation stopped. As prepare's, one process per data_dir prepares while
    the others wait on the folder's lock."""
    label, identity, files = streamed_identity(dataset, tokenizer)
    folder = Path(data_dir) / label
    if (folder / "meta.json").exists():
        return folder
    name, config, split = streamed_spec(dataset)
    dtype = token_dtype(enc.n_vocab)
    try:
        # opened before the lock: a corpus that cannot be read writes nothing, not even the lock file
        stream = corpus.open_stream(str(resolved(name)) if files else name, config, split, files)
        head = dict(tokenizer=tokenizer, vocab_size=enc.n_vocab, dtype=np.dtype(dtype).name,
                    source={"dataset": dataset, **stream.source, "files": len(files) if files else None,
                            "identity": identity})
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{folder}.lock", "w", opener=open_own) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "meta.json").exists():  # another process may have prepared it while this one waited
                corpus.write_streamed(folder, stream, functools.partial(encode_documents, tokenizer), workers, head,
                                      dtype)
    except corpus.CorpusError as e:
        raise DataError(str(e)) from None
    except OSError as e:
        raise cannot_access(e, data_dir) from e
    return folder


@functools.cache
def worker_tokenizer(name):
    return get_tokenizer(name)


def encode_documents(tokenizer, texts, first):
    """(train ids, val ids) of a chunk of a streamed corpus's documents, numbered from first: each document's ids
    after the tokenizer's delimiter (GPT-2's <|endoftext|>, as nanoGPT's and llm.c's preparations; a newline for byte
    tokens, as a folder's files are joined), document i in val when i % corpus.VAL_EVERY == 0. What the worker
    processes of engine/corpus.py run."""
    enc = worker_tokenizer(tokenizer)
    dtype = token_dtype(enc.n_vocab)
    delimiter = np.array([enc.eot_token if tokenizer == "gpt2" else ord("\n")], dtype=dtype)
    parts = {"train": [np.empty(0, dtype)], "val": [np.empty(0, dtype)]}
    for i, text in enumerate(texts, first):
        parts["val" if i % corpus.VAL_EVERY == 0 else "train"] += [delimiter, encode(enc, text).astype(dtype)]
    return np.concatenate(parts["train"]), np.concatenate(parts["val"])


META_TYPES = dict(tokenizer=str, vocab_size=int, dtype=str, train_tokens=int, val_tokens=int, source=dict,
                  unigram_entropy=float)


def load_meta(folder):
    """meta.json of a prepared folder, checked against train.bin and val.bin. A damaged folder is a DataError
    naming what is wrong; nothing on disk is changed."""
    path = Path(folder) / "meta.json"
    if not path.exists():
        raise DataError(f"{folder} is not a prepared dataset (no meta.json); run python data.py --dataset=...")
    damaged = f"{folder} is a damaged prepared dataset; delete the folder and run again to prepare it anew:"
    try:
        meta = read_json(path)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise DataError(f"{damaged} meta.json is not JSON") from None
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror})") from e
    for key, kind in META_TYPES.items():
        value = meta.get(key) if isinstance(meta, dict) else None
        # bool is an int to Python, and json writes a float that is whole as 2.0, never as 2
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise DataError(f"{damaged} meta.json's {key} is {value!r} (wanted: {kind.__name__}"
                            f"{' >= 0' if kind is int else ''})")
    if not isinstance(meta["source"].get("sha256"), str):
        raise DataError(f"{damaged} meta.json's source has no sha256 of the text, which every preparation "
                        "records")
    if meta["tokenizer"] not in VOCAB_SIZES:
        raise DataError(f"{damaged} meta.json's tokenizer is {meta['tokenizer']!r}, not one of {', '.join(TOKENIZERS)}")
    if meta["vocab_size"] != VOCAB_SIZES[meta["tokenizer"]]:
        raise DataError(f"{damaged} meta.json's vocab_size is {meta['vocab_size']}, but the {meta['tokenizer']} "
                        f"tokenizer's is {VOCAB_SIZES[meta['tokenizer']]}")
    dtype = np.dtype(token_dtype(meta["vocab_size"])).name
    if meta["dtype"] != dtype:
        raise DataError(f"{damaged} meta.json's dtype is {meta['dtype']}, but a vocab of {meta['vocab_size']} is "
                        f"stored as {dtype}")
    for split in ("train", "val"):
        expected = meta[f"{split}_tokens"] * np.dtype(dtype).itemsize
        problem = not_own_file(Path(folder) / f"{split}.bin")
        if problem:
            raise DataError(f"{damaged} {split}.bin is {problem}")
        try:
            size = (Path(folder) / f"{split}.bin").stat().st_size
        except FileNotFoundError:
            raise DataError(f"{damaged} {split}.bin is missing") from None
        if size != expected:
            raise DataError(f"{damaged} {split}.bin has {size} bytes, but meta.json's {meta[f'{split}_tokens']} "
                            f"{dtype} tokens take {expected}")
        largest = largest_id(str(Path(folder) / f"{split}.bin"), dtype, *file_version(Path(folder) / f"{split}.bin"))
        if largest >= meta["vocab_size"]:
            raise DataError(f"{damaged} {split}.bin holds token id {largest}, but the vocabulary has "
                            f"{meta['vocab_size']} (ids 0 to {meta['vocab_size'] - 1})")
    return meta


def file_version(path):
    info = path.stat()
    return info.st_size, info.st_mtime_ns, info.st_ino


@functools.cache
def largest_id(path, dtype, *version):
    """The largest token id in a .bin file, read once per version of the file (version: its size, modification time
    and inode): a full pass over the memmap, which load_meta's every call would otherwise repeat."""
    if version[0] == 0:
        return -1
    return int(np.max(np.memmap(path, dtype=dtype, mode="r")))


def check_length(meta, block_size):
    for split in ("train", "val"):
        n = meta[f"{split}_tokens"]
        if n <= block_size:
            raise DataError(f"the {split} split has {n} tokens, too few for --block_size={block_size} (it needs "
                            "more than block_size); use a smaller --block_size or a bigger corpus")


@functools.cache
def bin_dtype(folder):
    # read once per folder, not at every micro-step; a folder's tokenizer, and so its dtype, is in its name
    return load_meta(folder)["dtype"]


def windows(folder, split, starts, block_size, device):
    """x: the windows of block_size tokens of split that begin at starts; y: the same windows one token later."""
    import torch  # here, not at the top: python data.py never needs it and starts in a tenth of the time
    dtype = bin_dtype(str(folder))
    # a fresh memmap every call, as in nanoGPT: a long-lived one grows the process's memory
    data = np.memmap(os.path.join(folder, f"{split}.bin"), dtype=dtype, mode="r")
    x = torch.from_numpy(np.stack([data[i:i + block_size] for i in starts]).astype(np.int64))
    y = torch.from_numpy(np.stack([data[i + 1:i + 1 + block_size] for i in starts]).astype(np.int64))
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def get_batch(folder, split, batch_size, block_size, generator, device):
    """x: batch_size random windows of block_size tokens from split; y: the same windows one token later."""
    import torch
    ix = torch.randint(split_tokens(folder, split) - block_size, (batch_size,), generator=generator).tolist()
    return windows(folder, split, ix, block_size, device)


def split_tokens(folder, split):
    """The number of tokens in split, from its file's size."""
    return os.path.getsize(os.path.join(folder, f"{split}.bin")) // np.dtype(bin_dtype(str(folder))).itemsize


def eval_starts(n_tokens, block_size, count):
    """The start offsets of `count` evaluation windows of block_size + 1 tokens (x, and y one token later),
    evenly spaced over a split of n_tokens from its first token to its last: a function of the split and the
    sizes alone, so every seed, variant and number of processes is scored on the same windows, and two runs'
    losses can be compared window for window (paired by seed) instead of over their own random samples."""
    last = n_tokens - block_size - 1  # the last start whose y still fits in the split
    if last < 0:
        raise ValueError(f"a split of {n_tokens} tokens holds no window of {block_size} + 1 tokens")
    return [i * last // (count - 1) for i in range(count)] if count > 1 else [0]


def eval_batches(starts, batch_size, rank, world_size):
    """This process's share of the evaluation windows, in batches of at most batch_size starts: window i goes to
    process i mod world_size, so the processes' shares are disjoint and together are every window once, whatever
    world_size. Every process gets the same number of batches (the last ones may be short or empty) so that they
    can agree on a stop request before each batch."""
    mine = starts[rank::world_size]
    per_process = -(-len(starts) // world_size)  # the largest share, process 0's
    n_batches = -(-per_process // batch_size)
    return [mine[b * batch_size:(b + 1) * batch_size] for b in range(n_batches)]


@dataclass
class PrepareOptions:
    dataset: str = help_of("builtin, shakespeare, a path to a UTF-8 text file or a folder of text files, or "
                           "hf:NAME[:CONFIG[:SPLIT]] (datasets: a Hub name, or local parquet, JSON lines, text)",
                           default="builtin")
    tokenizer: Literal["byte", "gpt2"] = help_of(" or ".join(TOKENIZERS), default="byte")
    data_dir: str = help_of("where the prepared folders go", default="data")
    url: Optional[str] = help_of("where to download shakespeare from (file:// works)", default=None)
    workers: Optional[int] = help_of("processes that tokenize an hf: corpus (None: one per core this process may use)",
                                     default=None)


def what_was_read(source):
    """The files (or, of a corpus of the datasets library, the documents) a preparation read."""
    if "documents" in source:
        return f"{source['documents']:,} documents read ({source['val_documents']:,} in val)"
    skipped = f", {source['skipped']} binary files skipped" if source.get("skipped") else ""
    return f"{source['files']} files read{skipped}"


# a preparation whose output's reader goes away (`python data.py ... 2>&1 | head -1`: its progress bar's) stops as
# for SIGHUP, its temporary folder removed, rather than dying of SIGPIPE with the folder left
OUTPUT_LOST = "data.py: its output's reader went away (a closed pipe or terminal); it stops as for SIGHUP"


def main(argv):
    if wants_help(argv):
        print_help(__doc__, PrepareOptions)
        return 0
    handlers, output, opts = {}, None, None
    try:
        starting.done()  # in the try: from here a Ctrl-C is the KeyboardInterrupt below; before, starting's line
        handlers = signals.stop_on_signals()
        output = signals.keep_output(functools.partial(signals.hang_up, OUTPUT_LOST))  # its progress bar's reader
        opts = build(PrepareOptions, parse(argv, PrepareOptions))
        folder = prepare(opts.dataset, opts.tokenizer, opts.data_dir, opts.url, opts.workers)
        meta = load_meta(folder)
    except (UsageError, DataError) as e:
        return fail("data.py", e)
    except WriteError as e:
        print(f"data.py: {e}; nothing was prepared", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        sig = signals.signum(stop)
        streamed = opts is not None and is_streamed(opts.dataset)
        resumes = "; an hf: corpus resumes from its last chunk when run again" if streamed else ""
        print(f"data.py: stopped by {signals.name(sig)}; nothing was prepared (a prepared folder is complete or "
              f"absent){resumes}", file=sys.stderr)
        return signals.exit_code(sig)
    finally:
        signals.restore_output(output)
        signals.restore(handlers)
    print(f"{folder}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens ({meta['dtype']}), "
          f"vocab {meta['vocab_size']}, {what_was_read(meta['source'])}")
    # max: a split of one repeated token sums to -0.0 (or a rounding below it), which would print as "-0.0000"
    print(f"unigram entropy of val: {max(0.0, meta['unigram_entropy']):.4f} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
