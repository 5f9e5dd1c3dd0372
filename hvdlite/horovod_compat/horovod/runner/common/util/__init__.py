"""``horovod.runner.common.util``."""
