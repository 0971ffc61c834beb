"""Training a small DSA model in JAX and recording its selection traces (docs/training.md).

- corpus: byte-level documents of offline text (the Python standard library), split by path.
- forward: the training forward of hisparse_jax.models.dsa: next-token loss and the indexer KL,
  dense warm-up or sparse (top-k) attention.
- optimizer: AdamW; fit: the two-phase training loop; checkpoint: weights on disk.
- record: the trained model decoding long documents, its selections recorded.
"""
