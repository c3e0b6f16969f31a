"""Old path of chapter 4's fine-tuning helpers, kept for notebooks written against it: see ptlab/lessons/ch04_cnn_training."""
from ptlab.lessons.ch04_cnn_training.finetune import *  # noqa: F401,F403
from ptlab.lessons.ch04_cnn_training.finetune import DownloadBlocked, no_downloads  # noqa: F401
