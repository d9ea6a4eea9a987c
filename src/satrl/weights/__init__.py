"""Weights between the trainer and the engines: the trainer's bucket stream (`buckets`) and the transports that
carry it once per version (`dist`: a torch.distributed group)."""
