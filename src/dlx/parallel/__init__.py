"""Scale-out: process groups (`distributed`) and wrapping the model from outside, in one documented order (`wrap`)."""
