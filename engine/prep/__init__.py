"""Datasets and models in and out: text to token files, Hub streams, Hugging Face weights."""
