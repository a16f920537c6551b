"""The private descriptor pool our generated ``apache.rocketmq.v2`` messages live in.

protobuf refuses a second registration of the same symbol in its default pool; the
official ``rocketmq-python-client`` registers these names there, so ours go here.
"""

from google.protobuf import descriptor_pool

# Module state by necessity: generated modules register their file in it when imported (under
# the import lock, once per process); after that it is only read.
POOL = descriptor_pool.DescriptorPool()
