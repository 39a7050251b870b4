"""HTTP/REST front end (aiohttp): KServe v2 with Triton's extensions."""
