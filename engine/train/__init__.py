"""One segment of training: the model, its losses, the data batches, the memory they take (the
estimator), the loop and what it saves (checkpoints), compiles, guards against and counts
(FLOPs), on one device or several."""
