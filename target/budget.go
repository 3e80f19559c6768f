package target

import (
	"fmt"

	"github.com/nprdma/nprdma/internal/sizes"
)

// SplitBudget divides memory, the DRAM the configured namespaces may use
// together, into their budgets (NamespaceConfig.Budget): a namespace with a
// budget of its own (fixed[i] > 0) keeps it, and the others share what
// those leave in proportion to their sizes (nsSizes), each at most its size
// (what it cannot use stays free for namespaces created through the
// management API) and at least 16 blocks, in whole blocks. Budgets adding
// up to more than memory are an error. The pinned baseline
// (WithPinnedBudget) needs no split: it places namespaces in its pinned
// memory while they fit.
func SplitBudget(memory int64, nsSizes, fixed []int64) ([]int64, error) {
	if len(fixed) != len(nsSizes) {
		return nil, fmt.Errorf("target: SplitBudget: %d sizes, %d fixed budgets", len(nsSizes), len(fixed))
	}
	out := make([]int64, len(nsSizes))
	var fixedSum, freeSizes int64
	for i, s := range nsSizes {
		if fixed[i] > 0 {
			out[i] = fixed[i]
			fixedSum += fixed[i]
		} else {
			freeSizes += s
		}
	}
	if fixedSum > memory {
		return nil, fmt.Errorf("namespace budgets add up to %s, more than the %s of memory to share", sizes.Format(fixedSum), sizes.Format(memory))
	}
	left := memory - fixedSum
	for i, s := range nsSizes {
		if out[i] == 0 && freeSizes > 0 {
			share := min(int64(float64(left)*float64(s)/float64(freeSizes)), s)
			out[i] = max(share/BlockSize*BlockSize, minBudget)
		}
	}
	return out, nil
}
