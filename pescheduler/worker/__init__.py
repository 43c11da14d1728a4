"""The worker side: what runs inside a Dask worker. PE host, PE loop, fused chain, channels, source pump.

The deploying process never imports this package's loop; it only sends the
wire specs the PE host builds its PEs from.
"""
