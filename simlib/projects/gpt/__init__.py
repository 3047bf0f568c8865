"""Project 1: a small GPT on real English text (``notebooks/10_project_gpt.ipynb``, ``simlib train gpt``).

model  the GPT (blocks of ``simlib.models`` attention and MLP), split by heads for TP and by blocks for PP
text   the corpus shipped in ``simlib/data``, the byte-level BPE, the sharded token loader
task   ``GPTTask``: what the one training loop (``simlib.train``) needs from the project
run    sizes, plans by name, one call that runs a plan on fresh or warm processes, and the plots
prepare  ``simlib prepare gpt``: the GPU size's corpus, downloaded once (checksum, resume) to uint16 memmaps
"""

from .task import GPTTask

__all__ = ["GPTTask"]
