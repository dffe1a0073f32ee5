"""Training the ``cnn`` detector: crop banks from chain manifests and clean folders, camera-like
augmentation of clean photos (labelled clean), the chain-aware losses, the training loop, held-out
metrics, the model card and the leave-one-family-out driver."""
