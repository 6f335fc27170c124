"""What runs before and after the core and needs no weights: chat template, tokenizing and
validation, images, detokenizing and stop strings, per-request output queues."""
