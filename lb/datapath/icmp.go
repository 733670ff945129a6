// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"time"

	"github.com/l4lb/l4lb/bpf"
)

// MaxICMPRateLimit is the largest ICMPRateLimit: a million answers per
// second per CPU is already far more than any client needs to learn an MTU.
const MaxICMPRateLimit = 1_000_000

// icmpVars returns the load-time constants of the ICMP rate limiter for
// rate answers per second per CPU (bpf/include/config.h): one message per
// interval, bursts of up to rate messages. Rate 0 makes the interval 0,
// which the program reads as "send none".
func icmpVars(rate uint32) (map[string]any, error) {
	if rate > MaxICMPRateLimit {
		return nil, fmt.Errorf("datapath: ICMP rate limit %d per second is above %d: lower datapath.icmp_rate_limit", rate, MaxICMPRateLimit)
	}
	var interval, burst uint64
	if rate > 0 {
		interval = uint64(time.Second) / uint64(rate)
		burst = uint64(rate-1) * interval
	}
	return map[string]any{
		bpf.LbVarCfgIcmpIntervalNs: interval,
		bpf.LbVarCfgIcmpBurstNs:    burst,
	}, nil
}

// insertVars returns the load-time constants of the connection-table
// insert limiter for rate new entries per second per CPU, in bursts of up
// to a second's worth. Rate 0 makes the interval 0: no limit.
func insertVars(rate uint32) map[string]any {
	var interval, burst uint64
	if rate > 0 {
		interval = uint64(time.Second) / uint64(rate)
		burst = uint64(rate-1) * interval
	}
	return map[string]any{
		bpf.LbVarCfgInsertIntervalNs: interval,
		bpf.LbVarCfgInsertBurstNs:    burst,
	}
}
