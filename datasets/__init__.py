"""Storage formats: checkpoints, HDF5 rollout shards and manifests, real-car logs."""
