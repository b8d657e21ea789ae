package convert

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/cortiq/cortiq/kernels"
)

var isaFlag = flag.String("isa", "", "run the tests with this kernel set (generic, avx2, avx512) instead of the CPU's best")

func TestMain(m *testing.M) {
	flag.Parse()
	if *isaFlag != "" {
		if _, err := kernels.SetISA(*isaFlag); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	cleanup := tempCache()
	code := m.Run()
	cleanup()
	os.Exit(code)
}
