"""The work behind ``mgpu bench`` and ``mgpu run``, without the printing.

Benchmarks (``sddmm``, ``knn``, ``spmv``, ``spgemm``, ``jaccard``, ``mf``, ``sgd``) each time
mgpu and its peers in one run (``transfer`` times Dask's own moves between workers, TCP
against UCX): results are medians over repeats after warm-up; GPU times come from CUDA
events. The jobs of ``mgpu run`` and ``mgpu calibrate`` that are more than one library
call live beside them: ``mf_modes`` (several MF modes from one start), ``partition`` (spread a
matrix and check its chunks), ``knn_graph`` and ``calibrate``.
"""
