"""Neural-network building blocks: similarities, masks, the attention core and its backends, attention,
feed-forward blocks, layers, embeddings, encoders, the pooler. Import each from its module."""
