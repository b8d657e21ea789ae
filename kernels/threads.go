package kernels

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// DefaultThreads returns the number of workers a Pool starts by default:
// the machine's physical cores, at most GOMAXPROCS. A second hardware
// thread on a core shares its load units and caches, which memory-bound
// decode cannot use.
func DefaultThreads() int {
	n := runtime.GOMAXPROCS(0)
	if c := physicalCores(); c > 0 && c < n {
		n = c
	}
	return n
}

var physicalCores = sync.OnceValue(func() int {
	return countCores("/sys/devices/system/cpu")
})

// countCores counts the distinct (package, core) pairs of the CPUs listed
// under a Linux sysfs cpu directory; 0 when it cannot tell.
func countCores(dir string) int {
	cpus, err := filepath.Glob(filepath.Join(dir, "cpu[0-9]*"))
	if err != nil || len(cpus) == 0 {
		return 0
	}
	cores := map[string]bool{}
	for _, c := range cpus {
		if b, err := os.ReadFile(filepath.Join(c, "online")); err == nil && strings.TrimSpace(string(b)) == "0" {
			continue
		}
		pkg, err1 := os.ReadFile(filepath.Join(c, "topology", "physical_package_id"))
		core, err2 := os.ReadFile(filepath.Join(c, "topology", "core_id"))
		if err1 != nil || err2 != nil {
			return 0
		}
		cores[strings.TrimSpace(string(pkg))+"/"+strings.TrimSpace(string(core))] = true
	}
	return len(cores)
}
