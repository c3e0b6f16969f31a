"""Chapter 4, training a CNN (notebooks/04_cnn_training.ipynb, and part 2, notebooks/04_finetuning_and_bugs.ipynb):
pitfalls, exercises and fixtures."""
