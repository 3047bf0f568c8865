"""Text for the GPT project: the corpus shipped in the repo, a byte-level BPE made here, a sharded loader.

    data = TextData(seq_len=64)
    x, y = data.batch(step=7, batch_size=32)              # the global batch of step 7: (32, 64) token ids
    x, y = data.batch(7, 32, part=1, parts=2)             # rows 16..31 only: what DP rank 1 reads

Corpus: ``simlib/data/python_docs.txt`` (465 KB, the Python Language Reference's help topics; see
``simlib/data/README.md`` for source and licence). The first 90 % trains, the last 10 % is held out.

Tokenizer: a byte-level BPE with 1,024 tokens trained on the training split with Hugging Face
``tokenizers`` (committed as ``gpt_tokenizer.json``; ``python -m simlib.projects.gpt.text`` retrains it). Why BPE and not
characters: a token then carries ~2.9 characters, so a 64-token context sees ~190 characters and the model
spends its small budget on words rather than spelling; byte-level means no text is ever unknown.

Batches: global batch ``step`` is ``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn by a
generator seeded with (seed, step) alone, so the global batches are identical for every world size and plan,
and a resumed run at step k reads exactly what an uninterrupted one would. A rank asks for its ``part``
and reads only those rows.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "data"
CORPUS = DATA / "python_docs.txt"
TOKENIZER = DATA / "gpt_tokenizer.json"
VOCAB_SIZE = 1024
TRAIN_FRACTION = 0.9


def corpus() -> str:
    return CORPUS.read_text(encoding="utf-8")


def split_text(text: str) -> tuple[str, str]:
    """Training and held-out text: the first 90 % and the rest (cut at a blank line)."""
    cut = text.rfind("\n\n", 0, int(len(text) * TRAIN_FRACTION)) + 2
    return text[:cut], text[cut:]


def train_tokenizer(path=TOKENIZER, vocab_size: int = VOCAB_SIZE):
    """Train the byte-level BPE on the training split and save it to ``path`` (what ``python -m simlib.projects.gpt.text`` does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([split_text(corpus())[0]], trainer=trainer)
    tok.save(str(path))
    return tok


@lru_cache(maxsize=1)
def tokenizer():
    from tokenizers import Tokenizer
    if not TOKENIZER.exists():
        raise FileNotFoundError(f"{TOKENIZER} is missing: run `python -m simlib.projects.gpt.text` to train it here")
    return Tokenizer.from_file(str(TOKENIZER))


def encode(text: str) -> torch.Tensor:
    return torch.tensor(tokenizer().encode(text).ids, dtype=torch.long)


def decode(ids) -> str:
    return tokenizer().decode([int(i) for i in ids])


@lru_cache(maxsize=1)
def token_splits() -> tuple[torch.Tensor, torch.Tensor]:
    """The training and held-out token streams (encoded once per process)."""
    train, held_out = split_text(corpus())
    return encode(train), encode(held_out)


def unigram_cross_entropy() -> float:
    """Nats per held-out token of the best model that ignores context: training-split token frequencies
    (add-one smoothed). A model that learned anything beyond word frequencies goes well below it."""
    train, held_out = token_splits()
    counts = torch.bincount(train, minlength=tokenizer().get_vocab_size()).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[held_out].mean())


class TextData:
    """Windows of the token streams: deterministic global batches, shardable by rows, a fixed eval set."""

    def __init__(self, seq_len: int = 64, seed: int = 0, eval_windows: int = 64):
        self.seq_len, self.seed = seq_len, seed
        self.train, self.held_out = token_splits()
        n = min(eval_windows, (len(self.held_out) - 1) // seq_len)
        self.eval_windows = n

    @property
    def vocab_size(self) -> int:
        return tokenizer().get_vocab_size()

    def offsets(self, step: int, batch_size: int) -> torch.Tensor:
        """Start positions of global batch ``step``: a pure function of (seed, step)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, len(self.train) - self.seq_len - 1, (batch_size,), generator=g)

    def batch(self, step: int, batch_size: int, part: int = 0, parts: int = 1):
        """Rows ``part`` of ``parts`` of global batch ``step``: inputs and next-token targets (B, T) each."""
        if batch_size % parts:
            raise ValueError(f"a batch of {batch_size} does not split into {parts} equal parts")
        n = batch_size // parts
        starts = self.offsets(step, batch_size)[part * n:(part + 1) * n]
        windows = torch.stack([self.train[s:s + self.seq_len + 1] for s in starts.tolist()])  # (n, T + 1)
        return windows[:, :-1], windows[:, 1:]

    def eval_batches(self, batch_size: int = 16):
        """The held-out set: consecutive non-overlapping windows, in batches."""
        t = self.seq_len
        windows = torch.stack([self.held_out[i * t:i * t + t + 1] for i in range(self.eval_windows)])
        for i in range(0, len(windows), batch_size):
            w = windows[i:i + batch_size]
            yield w[:, :-1], w[:, 1:]

    def epochs(self, tokens: int) -> float:
        return tokens / len(self.train)


def bits(nats: float) -> float:
    return nats / math.log(2)


if __name__ == "__main__":
    tok = train_tokenizer()
    train, held_out = token_splits.__wrapped__()
    print(f"trained {TOKENIZER.name}: {tok.get_vocab_size()} tokens; {len(train):,} training and {len(held_out):,} "
          f"held-out tokens ({len(corpus()) / (len(train) + len(held_out)):.2f} characters per token)")
