/**
 * The query sends of a batched step's rows as one device op a layer: each row's signalled send of
 * a layer's query (its q̃, or the pages its device index ranked with it) joins the layer's group,
 * and the group goes as one HostTransfers.sendSignalledRows — every row's copy, then one value for
 * all — when the first row's job needs its ready signal or the layer before's attention starts
 * (flush: before the hand-off the device waits on, so the stage computes the next layer meanwhile).
 * One per link (SendBatch.of): a link runs one batched step at a time.
 */
import type { DecodeBatchStep } from "@hybridgen/core";
import { type HostSignal, type HostTransfers, type SignalledSend, fail } from "@hybridgen/spec";
import { StepMark, perOwner } from "../step-scope.js";

/** A layer's sends not sent yet; its signal, once they are (every row of the group waits for the same value). */
export class PendingSends {
  private readonly sends: SignalledSend[] = [];
  private sent: HostSignal | null = null;

  constructor(private readonly link: HostTransfers, private readonly onSend: (g: PendingSends) => void) {}

  add(send: SignalledSend): this {
    if (this.sent) fail("hybrid attention: a query send joined a group already sent");
    this.sends.push(send);
    return this;
  }

  /** The group's signal: its sends go now unless they went already. */
  signal(): HostSignal {
    if (!this.sent) {
      this.sent = this.link.sendSignalledRows!(this.sends);
      this.onSend(this);
    }
    return this.sent;
  }
}

export class SendBatch {
  private readonly mark = new StepMark();
  /** Per layer: its group not sent yet. */
  private readonly open = new Map<number, PendingSends>();
  /** sendSignalledRows calls made (a test counts them). */
  calls = 0;

  static readonly of = perOwner((link: HostTransfers) => new SendBatch(link));

  private constructor(private readonly link: HostTransfers) {
    if (!link.sendSignalledRows) fail("hybrid attention: the host link sends no batch of queries (sendSignalledRows)");
  }

  /** A row's send of `layer`'s query in `step`: the layer's open group, whose signal() the row's job takes. */
  join(step: DecodeBatchStep, layer: number, send: SignalledSend): PendingSends {
    if (this.mark.moveTo(step)) {
      this.open.clear(); // a failed step's groups: no job of theirs was submitted
    }
    let g = this.open.get(layer);
    if (!g) {
      const made = new PendingSends(this.link, (sent) => {
        this.calls++;
        if (this.open.get(layer) === sent) this.open.delete(layer);
      });
      this.open.set(layer, made);
      g = made;
    }
    return g.add(send);
  }

  /** Every open group of `step` goes now. */
  flush(step: DecodeBatchStep): void {
    if (!this.mark.holds(step)) return;
    for (const g of [...this.open.values()]) g.signal();
  }
}
