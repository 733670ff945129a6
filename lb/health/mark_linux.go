// SPDX-License-Identifier: Apache-2.0

package health

import (
	"errors"
	"fmt"
	"syscall"
)

// setMark sets SO_MARK on a socket that is not connected yet, so that even
// its first packet (the SYN, or the first datagram) carries the mark.
func setMark(c syscall.RawConn, mark uint32) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(mark))
	})
	if err == nil {
		err = serr
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EPERM):
		return fmt.Errorf("set SO_MARK %#x on the probe socket: %w: marking probes needs CAP_NET_ADMIN; grant it to l4lbd or probe backends directly", mark, err)
	}
	return fmt.Errorf("set SO_MARK %#x on the probe socket: %w", mark, err)
}
