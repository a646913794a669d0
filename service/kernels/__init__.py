"""Pure NumPy kernels, one module per operator; importing this package registers them all."""

from service.kernels import constant, constant_of_shape, random_uniform_like, shape, tile

__all__ = ["constant", "constant_of_shape", "random_uniform_like", "shape", "tile"]
