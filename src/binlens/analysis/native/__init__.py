"""The engine's C kernels (`_descent`, `_x86scan`) and `kernels.native`, which loads one or says to run the
Python twin."""
