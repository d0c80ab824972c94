"""Continued pretraining: `init_from` (`model.init_from` resolved once into an `InitFrom`: weights and model shape)
and `vocab_growth` (whether the data's tokenizer extends the weights'; the embedding and head grown to it)."""
