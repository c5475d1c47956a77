"""The memory gateway: the seeds' HTTP contracts served over the pipeline.

A stateless FastAPI service and a NATS client of the workers (through the SDK in
``memstream.producers``); run any number of copies behind a load balancer.
``create_app`` builds it; ``memstream gateway`` serves it.
"""
