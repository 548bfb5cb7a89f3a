"""What nodecheck accepts as plausible from a source it does not control (a tool's output, a driver,
a snapshot from a support ticket). Beyond these a source is refused with a clear error, so a
corrupt or hostile input cannot take gigabytes of memory or minutes of CPU."""

MAX_GPUS = 64  # the largest single nodes ship 16 GPUs; NVL racks are many nodes
MAX_NICS = 4096  # netdevs of a node, veths of containers included
MAX_TOPO_DEVICES = MAX_GPUS + 256  # nvidia-smi topo -m columns: GPUs and NICs
MAX_NVLINKS = 64  # per GPU (H100 and B200: 18)
MAX_NVLINK_MBPS = 1_000_000  # one NVLink's speed as NVML says it, MB/s (Blackwell: 53125); past 1 TB/s it is garbage
# one NIC port's rate, Mb/s: the fastest ship 800 Gb/s (XDR, 800GbE); past 10 Tb/s a sysfs speed or a port's rate is
# garbage, no spec to judge by (and `config init`, whose config allows no more, writes no such NIC)
MAX_LINK_MBPS = 10_000_000

# bytes read from one source
MAX_COMMAND_OUTPUT = 16 * 1024 * 1024  # lstopo's XML of a large node is a few MB
MAX_SYSFS_FILE = 64 * 1024  # sysfs attributes are a page at most
MAX_CONF_FILE = 1024 * 1024  # a config file read as its reader reads it: its first megabyte, whatever its size
READ_HEAD = frozenset({"/etc/nccl.conf"})  # read_text reads these so (NCCL reads the file whole)
MAX_JSON_DOCUMENT = 16 * 1024 * 1024
MAX_DIR_ENTRIES = 16_384  # names read from one directory (IOMMU groups, PCI devices: thousands on the largest nodes)

# a snapshot tarball: what `nodecheck snapshot` writes is a few hundred files and a few MB
MAX_SNAPSHOT_MEMBERS = 20_000
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
