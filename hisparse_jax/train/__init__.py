"""Training a small model in JAX (DSA, or the research kit's model with any protocol indexer) and
recording its selection traces (docs/training.md, docs/research.md).

- corpus: byte-level documents of offline text (the Python standard library), split by path.
- model: the model a run trains (dsa.Config, or a kit Config with the indexer) and its family.
- indexer_spec: `--indexer MODULE:NAME`, and how a checkpoint records and rebuilds an indexer.
- forward: the training forward of the MLA model: next-token loss and the indexer's KL through
  its train_features / train_scores, dense warm-up or sparse (top-k) attention.
- optimizer: AdamW; fit: the two-phase training loop; checkpoint: weights on disk.
- record: the trained model decoding long documents, its selections recorded.
"""
