// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package health

import (
	"fmt"
	"syscall"
)

// setMark fails: socket marks exist only on Linux, the only system l4lbd
// forwards on.
func setMark(_ syscall.RawConn, mark uint32) error {
	return fmt.Errorf("set mark %#x on the probe socket: socket marks need Linux; probe backends directly on this system", mark)
}
