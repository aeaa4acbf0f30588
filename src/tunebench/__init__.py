"""tunebench: plan, measure and explore fine-tuning jobs of foundation models."""

__version__ = "0.1.0"
