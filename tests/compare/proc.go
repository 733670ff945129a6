// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"os/exec"
	"syscall"
)

// commandContext is exec.CommandContext for the tools a run starts: killed
// when ctx ends, and when this program dies, so nothing outlives a run.
func commandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}
