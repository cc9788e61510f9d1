"""base: the layout (paths), the kinds of error, atomic writes, the one reader of outputs,
the machine and the timings records; below every other package."""
