package netio

import "runtime"

func gomaxprocs() int { return runtime.GOMAXPROCS(0) }
