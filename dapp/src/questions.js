// The user's questions on this device (localStorage, per chain, escrow and account), so an
// unanswered deposit can still be refunded after a reload.

export const STATUS = {
  unsigned: "unanswered (payment not signed)",
  asked: "asked",
  failed: "unanswered",
  answered: "answered",
  refunded: "refunded",
};

const MAX_KEPT = 50;

export class Questions {
  constructor(config, account) {
    this.key = `planet.questions.${config.chain_id}.${config.escrow}.${account}`.toLowerCase();
  }

  all() {
    try {
      const items = JSON.parse(localStorage.getItem(this.key) || "[]");
      return Array.isArray(items) ? items : [];
    } catch {
      return [];
    }
  }

  save(items) {
    try {
      localStorage.setItem(this.key, JSON.stringify(items.slice(0, MAX_KEPT)));
    } catch {
      // storage full or disabled: the list lives for this page view only
    }
  }

  add(item) {
    this.save([{ ...item, at: Date.now() }, ...this.all()]);
  }

  update(queryId, fields) {
    this.save(this.all().map((item) => (item.queryId === queryId ? { ...item, ...fields } : item)));
  }
}
