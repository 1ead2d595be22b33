"""The machine a job runs on: hosts and their layout, the horovodrun wrapper, the
launcher's lifetime, each worker's share of the cores, devices and host capacity."""
