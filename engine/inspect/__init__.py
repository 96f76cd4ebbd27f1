"""Reading runs and machines: the runs list, compare, sample, doctor."""
