"""The default classifier, shipped as package data (``docintel.models``, folder ``finsent/``).

Trained with ``docintel train`` on the vendored finance sentiment data; see
``data/twitter_fin_sentiment/SOURCE.md`` in the repository for the data's origin and licence.
"""
